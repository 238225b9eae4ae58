// Causal softmax (see core/ops_attention.h). Only the first (i + 1) entries of row i are read; the rest
// of the row is written as zeros, so the upper triangle costs a write and no read. Statistics in float
// (double for float64).
//
// Rows up to 1024 wide (every GPT context we train) go to the warp kernels: one warp per row, the row
// held in registers (kPerLane values per lane, lane l owning columns l, l + 32, ...), reductions by
// shuffles and no shared memory or __syncthreads, so each row is read once and written once (a block
// per row is latency-bound on its two block reductions). Wider rows use the block-per-row kernels below.
#include "core/attention_kernels.h"
#include "core/cuda/kernel_utils.cuh"

namespace dpt::cuda_kernels {

namespace {

template <class T>
__global__ void causal_softmax_forward_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t t, float scale) {
  using C = std::conditional_t<std::is_same_v<T, double>, double, float>;
  __shared__ C scratch[32];
  const int64_t row = blockIdx.x;
  const int64_t visible = row % t + 1;
  const T* xr = x + row * t;
  T* yr = y + row * t;
  C m = -INFINITY;
  for (int64_t j = threadIdx.x; j < visible; j += blockDim.x) m = max(m, static_cast<C>(scale) * convert<C>(xr[j]));
  m = block_max(m, scratch);
  C sum = 0;
  for (int64_t j = threadIdx.x; j < visible; j += blockDim.x) sum += exp(static_cast<C>(scale) * convert<C>(xr[j]) - m);
  const C inv = C(1) / block_sum(sum, scratch);
  for (int64_t j = threadIdx.x; j < t; j += blockDim.x) {
    yr[j] = convert<T>(j < visible ? exp(static_cast<C>(scale) * convert<C>(xr[j]) - m) * inv : C(0));
  }
}

template <class T>
__global__ void causal_softmax_backward_kernel(const T* __restrict__ gy, const T* __restrict__ y, T* __restrict__ gx,
                                               int64_t t, float scale) {
  using C = std::conditional_t<std::is_same_v<T, double>, double, float>;
  __shared__ C scratch[32];
  const int64_t row = blockIdx.x;
  const int64_t visible = row % t + 1;
  const T* gyr = gy + row * t;
  const T* yr = y + row * t;
  T* gxr = gx + row * t;
  C dot = 0;
  for (int64_t j = threadIdx.x; j < visible; j += blockDim.x) dot += convert<C>(gyr[j]) * convert<C>(yr[j]);
  dot = block_sum(dot, scratch);
  for (int64_t j = threadIdx.x; j < t; j += blockDim.x) {
    gxr[j] = convert<T>(j < visible ? static_cast<C>(scale) * convert<C>(yr[j]) * (convert<C>(gyr[j]) - dot) : C(0));
  }
}


template <class T, int kPerLane>
__global__ void causal_softmax_forward_warp_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t rows, int64_t t,
                                                   float scale) {
  const int lane = threadIdx.x & 31;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (row >= rows) return;
  const int64_t visible = row % t + 1;
  const T* xr = x + row * t;
  T* yr = y + row * t;
  float v[kPerLane];
  float m = -INFINITY;
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int64_t j = lane + 32 * i;
    v[i] = j < visible ? scale * convert<float>(xr[j]) : -INFINITY;
    m = fmaxf(m, v[i]);
  }
  m = warp_max(m);
  float sum = 0;
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int64_t j = lane + 32 * i;
    v[i] = j < visible ? expf(v[i] - m) : 0.0f;
    sum += v[i];
  }
  const float inv = 1.0f / warp_sum(sum);
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int64_t j = lane + 32 * i;
    if (j < t) yr[j] = convert<T>(v[i] * inv);
  }
}

template <class T, int kPerLane>
__global__ void causal_softmax_backward_warp_kernel(const T* __restrict__ gy, const T* __restrict__ y,
                                                    T* __restrict__ gx, int64_t rows, int64_t t, float scale) {
  const int lane = threadIdx.x & 31;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (row >= rows) return;
  const int64_t visible = row % t + 1;
  const T* gyr = gy + row * t;
  const T* yr = y + row * t;
  T* gxr = gx + row * t;
  float g[kPerLane], p[kPerLane];
  float dot = 0;
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int64_t j = lane + 32 * i;
    g[i] = j < visible ? convert<float>(gyr[j]) : 0.0f;
    p[i] = j < visible ? convert<float>(yr[j]) : 0.0f;
    dot += g[i] * p[i];
  }
  dot = warp_sum(dot);
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int64_t j = lane + 32 * i;
    if (j < t) gxr[j] = convert<T>(scale * p[i] * (g[i] - dot));
  }
}

constexpr int kWarpsPerBlock = 4;

// Calls f(std::integral_constant<int, K>) with the smallest K in {1, 2, 4, 8, 16, 32} with 32 K >= t.
template <class F>
bool with_per_lane(int64_t t, F&& f) {
  if (t <= 32) return f(std::integral_constant<int, 1>{}), true;
  if (t <= 64) return f(std::integral_constant<int, 2>{}), true;
  if (t <= 128) return f(std::integral_constant<int, 4>{}), true;
  if (t <= 256) return f(std::integral_constant<int, 8>{}), true;
  if (t <= 512) return f(std::integral_constant<int, 16>{}), true;
  if (t <= 1024) return f(std::integral_constant<int, 32>{}), true;
  return false;
}
}  // namespace

void causal_softmax_forward(const Tensor& x, const Tensor& y, int64_t rows, int64_t t, double scale) {
  if (rows == 0) return;
  cudaStream_t stream = cuda::current_stream(x.device().index);
  visit_floating(x.dtype(), "causal_softmax", [&](auto tag) {
    using T = decltype(tag);
    if constexpr (!std::is_same_v<T, double>) {
      const unsigned blocks = static_cast<unsigned>((rows + kWarpsPerBlock - 1) / kWarpsPerBlock);
      bool done = with_per_lane(t, [&](auto per_lane) {
        causal_softmax_forward_warp_kernel<T, decltype(per_lane)::value>
            <<<blocks, 32 * kWarpsPerBlock, 0, stream>>>(x.data<T>(), y.data<T>(), rows, t, static_cast<float>(scale));
      });
      if (done) {
        DPT_CUDA_CHECK_LAUNCH();
        return;
      }
    }
    causal_softmax_forward_kernel<T><<<static_cast<unsigned>(rows), row_threads(t), 0, stream>>>(
        x.data<T>(), y.data<T>(), t, static_cast<float>(scale));
    DPT_CUDA_CHECK_LAUNCH();
  });
}

void causal_softmax_backward(const Tensor& grad_y, const Tensor& y, const Tensor& grad_x, int64_t rows, int64_t t,
                             double scale) {
  if (rows == 0) return;
  cudaStream_t stream = cuda::current_stream(y.device().index);
  visit_floating(y.dtype(), "causal_softmax backward", [&](auto tag) {
    using T = decltype(tag);
    if constexpr (!std::is_same_v<T, double>) {
      const unsigned blocks = static_cast<unsigned>((rows + kWarpsPerBlock - 1) / kWarpsPerBlock);
      bool done = with_per_lane(t, [&](auto per_lane) {
        causal_softmax_backward_warp_kernel<T, decltype(per_lane)::value><<<blocks, 32 * kWarpsPerBlock, 0, stream>>>(
            grad_y.data<T>(), y.data<T>(), grad_x.data<T>(), rows, t, static_cast<float>(scale));
      });
      if (done) {
        DPT_CUDA_CHECK_LAUNCH();
        return;
      }
    }
    causal_softmax_backward_kernel<T><<<static_cast<unsigned>(rows), row_threads(t), 0, stream>>>(
        grad_y.data<T>(), y.data<T>(), grad_x.data<T>(), t, static_cast<float>(scale));
    DPT_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace dpt::cuda_kernels
