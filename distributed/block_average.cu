// The reduction step of ZeRO-1's sharded buckets on the copy engines (DDPOptions::copy_engines): this
// rank's block of a bucket becomes the average of every rank's copy of that block. The copies arrive by
// an all-to-all the copy engines move; this kernel is the only SM work of the reduce-scatter, one read of
// each copy and one write.
#include <algorithm>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "core/cuda/check.h"
#include "core/error.h"
#include "distributed/block_average.h"

namespace dpt::dist {
namespace {

template <class T>
__device__ float to_float(T v) { return static_cast<float>(v); }
template <>
__device__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
template <>
__device__ float to_float(__half v) { return __half2float(v); }

template <class T>
__device__ T from_float(float v) { return static_cast<T>(v); }
template <>
__device__ __nv_bfloat16 from_float(float v) { return __float2bfloat16(v); }
template <>
__device__ __half from_float(float v) { return __float2half(v); }

struct Inputs {
  const void* ptr[kMaxAveragedRanks];
};

// Sums in float32 in rank order (the same order whichever rank owns the chunk), then scales by
// 1/world and rounds once: for two ranks that is the correctly rounded mean of the two values.
template <class T>
__global__ void average_kernel(T* out, Inputs in, int ranks, int64_t n, float scale) {
  constexpr int kVec = 16 / sizeof(T);
  struct alignas(16) Pack { T v[kVec]; };
  const int64_t packs = n / kVec;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t p = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; p < packs; p += stride) {
    float acc[kVec];
    Pack first = reinterpret_cast<const Pack*>(in.ptr[0])[p];
    for (int k = 0; k < kVec; ++k) acc[k] = to_float(first.v[k]);
    for (int r = 1; r < ranks; ++r) {
      Pack x = reinterpret_cast<const Pack*>(in.ptr[r])[p];
      for (int k = 0; k < kVec; ++k) acc[k] += to_float(x.v[k]);
    }
    Pack result;
    for (int k = 0; k < kVec; ++k) result.v[k] = from_float<T>(acc[k] * scale);
    reinterpret_cast<Pack*>(out)[p] = result;
  }
  // The tail of a chunk whose length is not a whole number of 16-byte packs.
  for (int64_t i = packs * kVec + static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    float acc = 0;
    for (int r = 0; r < ranks; ++r) acc += to_float(static_cast<const T*>(in.ptr[r])[i]);
    out[i] = from_float<T>(acc * scale);
  }
}

template <class T>
void launch(void* out, const std::vector<const void*>& inputs, int64_t n, cudaStream_t stream) {
  Inputs in{};
  for (size_t r = 0; r < inputs.size(); ++r) in.ptr[r] = inputs[r];
  const int ranks = static_cast<int>(inputs.size());
  constexpr int kThreads = 256;
  const int64_t packs = n / (16 / static_cast<int64_t>(sizeof(T)));
  // Enough blocks to cover the chunk once, capped: a grid-stride loop does the rest, and a small grid
  // leaves most SMs to the backward kernels running beside it.
  const int blocks = static_cast<int>(std::min<int64_t>(std::max<int64_t>((packs + kThreads - 1) / kThreads, 1), 264));
  average_kernel<T><<<blocks, kThreads, 0, stream>>>(static_cast<T*>(out), in, ranks, n, 1.0f / ranks);
  DPT_CUDA_CHECK_LAUNCH();
}

}  // namespace

void block_average(void* out, const std::vector<const void*>& inputs, int64_t n, DType dtype, cudaStream_t stream) {
  if (n == 0) return;
  switch (dtype) {
    case DType::Float32: launch<float>(out, inputs, n, stream); break;
    case DType::BFloat16: launch<__nv_bfloat16>(out, inputs, n, stream); break;
    case DType::Float16: launch<__half>(out, inputs, n, stream); break;
    default: DPT_FAIL("block_average: dtype {} is not supported", dtype_name(dtype));
  }
}

}  // namespace dpt::dist
