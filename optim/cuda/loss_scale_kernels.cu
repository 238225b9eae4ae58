// Unscaling of fp16 (or bf16, float32) gradients into float32 master gradients, with the inf/NaN check
// fused into the same pass (see loss_scale_kernels.h).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "core/cuda/check.h"
#include "core/cuda/stream.h"
#include "core/error.h"
#include "optim/cuda/loss_scale_kernels.h"

namespace dpt::optim::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 1024;

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }

// Grid-stride loop. Each thread remembers whether it saw a non-finite value and writes the flag at most
// once; concurrent writers all store 1, so no atomic is needed.
template <class T>
__global__ void unscale_kernel(const T* __restrict__ src, float* __restrict__ dst, int64_t n, float inv_scale,
                               int32_t* __restrict__ found_inf) {
  bool bad = false;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const float v = to_float(src[i]) * inv_scale;
    dst[i] = v;
    bad |= !isfinite(v);
  }
  if (bad) *found_inf = 1;
}

template <class T>
void launch(const void* src, float* dst, int64_t n, float inv_scale, int32_t* found_inf) {
  int64_t blocks = (n + kThreads - 1) / kThreads;
  if (blocks > kMaxBlocks) blocks = kMaxBlocks;
  unscale_kernel<T><<<static_cast<unsigned>(blocks), kThreads, 0, dpt::cuda::current_stream()>>>(
      static_cast<const T*>(src), dst, n, inv_scale, found_inf);
  DPT_CUDA_CHECK_LAUNCH();
}

}  // namespace

void unscale_and_check(const void* src, GradType type, float* dst, int64_t n, float inv_scale, int32_t* found_inf) {
  if (n == 0) return;
  switch (type) {
    case GradType::Float32:
      return launch<float>(src, dst, n, inv_scale, found_inf);
    case GradType::BFloat16:
      return launch<__nv_bfloat16>(src, dst, n, inv_scale, found_inf);
    case GradType::Float16:
      return launch<__half>(src, dst, n, inv_scale, found_inf);
  }
  DPT_FAIL("unscale_and_check: unknown gradient type {}", static_cast<int>(type));
}

}  // namespace dpt::optim::cuda
