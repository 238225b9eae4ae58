// Causal softmax (see core/ops_attention.h). One block per row of scores; only the first (i + 1)
// entries of row i are read, the rest of the row is written as zeros, so the upper triangle costs a
// write and no read. Statistics in float (double for float64).
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

}  // namespace

void causal_softmax_forward(const Tensor& x, const Tensor& y, int64_t rows, int64_t t, double scale) {
  if (rows == 0) return;
  cudaStream_t stream = cuda::current_stream(x.device().index);
  visit_floating(x.dtype(), "causal_softmax", [&](auto tag) {
    using T = decltype(tag);
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
    causal_softmax_backward_kernel<T><<<static_cast<unsigned>(rows), row_threads(t), 0, stream>>>(
        grad_y.data<T>(), y.data<T>(), grad_x.data<T>(), t, static_cast<float>(scale));
    DPT_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace dpt::cuda_kernels
