// The activation's backward for dpt::linear when it cannot ride in a GEMM epilogue: one pass,
// grad_pre = grad_out * act'(saved), in float, rounded once (the unfused ops take two passes and two
// roundings: act'(x) into a temporary, then the product).
//   GELU (tanh form, GPT-2): act'(x) = 0.5 (1 + t) + 0.5 x (1 - t^2) sqrt(2/pi) (1 + 3 * 0.044715 x^2),
//   t = tanh(sqrt(2/pi) (x + 0.044715 x^3)), `saved` = the pre-activation x — the formula of core's
//   GeluGrad kernel.
//   ReLU: act'(x) = [x > 0] = [relu(x) > 0], `saved` = the activation's output.
#include "core/cuda/gemm_lt.h"
#include "core/cuda/kernel_utils.cuh"
#include "core/kernel_profiler.h"

namespace dpt::cuda_kernels {

namespace {

template <class T, LtActivation Act>
__global__ void activation_backward_kernel(const T* __restrict__ grad_out, const T* __restrict__ saved,
                                           T* __restrict__ grad_pre, int64_t n) {
  using C = Compute<T>;
  const C k = static_cast<C>(0.7978845608028654), c = static_cast<C>(0.044715);
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const C g = convert<C>(grad_out[i]), x = convert<C>(saved[i]);
    C d;
    if constexpr (Act == LtActivation::Gelu) {
      const C t = tanh(k * (x + c * x * x * x));
      d = C(0.5) * (C(1) + t) + C(0.5) * x * (C(1) - t * t) * k * (C(1) + C(3) * c * x * x);
    } else {
      d = x > C(0) ? C(1) : C(0);
    }
    grad_pre[i] = convert<T>(g * d);
  }
}

}  // namespace

void activation_backward(const Tensor& grad_out, const Tensor& saved, const Tensor& grad_pre, LtActivation act) {
  DPT_CHECK(grad_out.is_contiguous() && saved.is_contiguous() && grad_pre.is_contiguous() &&
                grad_out.numel() == grad_pre.numel() && saved.numel() == grad_pre.numel() &&
                grad_out.dtype() == grad_pre.dtype() && saved.dtype() == grad_pre.dtype(),
            "activation_backward (CUDA): expected three contiguous tensors of one size and dtype, found {} {}, {} {}, "
            "{} {}",
            shape_str(grad_out.shape()), dtype_name(grad_out.dtype()), shape_str(saved.shape()),
            dtype_name(saved.dtype()), shape_str(grad_pre.shape()), dtype_name(grad_pre.dtype()));
  const int device = device_of(grad_pre, {&grad_out, &saved}, "activation_backward");
  const int64_t n = grad_pre.numel();
  if (n == 0) return;
  cuda::DeviceGuard guard(device);
  KernelTimer timer("linear_activation_backward", true);
  cudaStream_t stream = cuda::current_stream(device);
  visit_floating(grad_pre.dtype(), "activation_backward", [&](auto tag) {
    using T = decltype(tag);
    const unsigned grid = grid_for(n, device);
    if (act == LtActivation::Gelu) {
      activation_backward_kernel<T, LtActivation::Gelu>
          <<<grid, kThreads, 0, stream>>>(ptr<const T>(grad_out), ptr<const T>(saved), ptr<T>(grad_pre), n);
    } else {
      activation_backward_kernel<T, LtActivation::Relu>
          <<<grid, kThreads, 0, stream>>>(ptr<const T>(grad_out), ptr<const T>(saved), ptr<T>(grad_pre), n);
    }
    DPT_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace dpt::cuda_kernels
