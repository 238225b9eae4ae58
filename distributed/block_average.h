#pragma once
// CUDA builds only: the averaging kernel of sharded buckets on the copy engines (block_average.cu).
#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "core/dtype.h"

namespace dpt::dist {

inline constexpr int kMaxAveragedRanks = 8;  // one NVLink domain of a host

// out[i] = (inputs[0][i] + ... + inputs[R-1][i]) / R for i < n, summed in float32 in the order given;
// `out` may be one of the inputs. Every pointer is 16-byte aligned. float32, bfloat16 and float16.
void block_average(void* out, const std::vector<const void*>& inputs, int64_t n, DType dtype, cudaStream_t stream);

}  // namespace dpt::dist
