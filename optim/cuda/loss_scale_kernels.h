#pragma once
// CUDA half of the loss scaler (optim/loss_scaler.h), built only with CUDA. Host-side declarations only,
// so CPU code can call them behind DPT_HAVE_CUDA.
#include <cstdint>

namespace dpt::optim::cuda {

// Element type of the scaled gradient being read.
enum class GradType { Float32, BFloat16, Float16 };

// dst[i] = float(src[i]) * inv_scale for i < n, and *found_inf = 1 when any dst[i] is inf or NaN
// (the flag is only ever set, never cleared, so one flag serves all tensors of a step). Runs on the
// current stream of the current device without waiting for it: the caller reads the flag once per step.
void unscale_and_check(const void* src, GradType type, float* dst, int64_t n, float inv_scale, int32_t* found_inf);

}  // namespace dpt::optim::cuda
