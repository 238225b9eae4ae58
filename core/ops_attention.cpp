#include "core/ops_attention.h"

#include "core/attention_kernels.h"
#include "core/autograd.h"
#include "core/error.h"
#include "core/kernel_profiler.h"
#ifdef DPT_HAVE_CUDA
#include "core/cuda/stream.h"
#endif

namespace dpt {

namespace {

void forward_kernel(const Tensor& x, const Tensor& y, int64_t rows, int64_t t, double scale) {
#ifdef DPT_HAVE_CUDA
  if (x.device().is_cuda()) {
    cuda::DeviceGuard guard(x.device().index);
    KernelTimer timer("causal_softmax_forward", true);
    cuda_kernels::causal_softmax_forward(x, y, rows, t, scale);
    return;
  }
#endif
  cpu::causal_softmax_forward(x, y, rows, t, scale);
}

void backward_kernel(const Tensor& gy, const Tensor& y, const Tensor& gx, int64_t rows, int64_t t, double scale) {
#ifdef DPT_HAVE_CUDA
  if (y.device().is_cuda()) {
    cuda::DeviceGuard guard(y.device().index);
    KernelTimer timer("causal_softmax_backward", true);
    cuda_kernels::causal_softmax_backward(gy, y, gx, rows, t, scale);
    return;
  }
#endif
  cpu::causal_softmax_backward(gy, y, gx, rows, t, scale);
}

}  // namespace

Tensor causal_softmax(const Tensor& scores, double scale) {
  DPT_CHECK(scores.dim() >= 2 && scores.size(-1) == scores.size(-2),
            "causal_softmax: expected scores [..., T, T], found {}", shape_str(scores.shape()));
  DPT_CHECK(is_floating(scores.dtype()), "causal_softmax: expected a floating dtype, found {}",
            dtype_name(scores.dtype()));
  Tensor x = scores.contiguous();
  int64_t t = x.size(-1);
  int64_t rows = t == 0 ? 0 : x.numel() / t;
  Tensor y = Tensor::empty(x.shape(), x.options());
  forward_kernel(x, y, rows, t, scale);
  record_op("CausalSoftmaxBackward", {scores}, {y}, [y = y.detach(), rows, t, scale](const std::vector<Tensor>& g) {
    Tensor gx = Tensor::empty(y.shape(), y.options());
    backward_kernel(g[0].contiguous(), y, gx, rows, t, scale);
    return std::vector<Tensor>{gx};
  });
  return y;
}

}  // namespace dpt
