#include "core/ops_attention.h"

#include "core/attention_kernels.h"
#include "core/autograd.h"
#include "core/error.h"
#include "core/kernel_dispatch.h"

namespace dpt {

Tensor causal_softmax(const Tensor& scores, double scale) {
  DPT_CHECK(scores.dim() >= 2 && scores.size(-1) == scores.size(-2),
            "causal_softmax: expected scores [..., T, T], found {}", shape_str(scores.shape()));
  DPT_CHECK(is_floating(scores.dtype()), "causal_softmax: expected a floating dtype, found {}",
            dtype_name(scores.dtype()));
  Tensor x = scores.contiguous();
  int64_t t = x.size(-1);
  int64_t rows = t == 0 ? 0 : x.numel() / t;
  Tensor y = Tensor::empty(x.shape(), x.options());
  DPT_KERNEL_DISPATCH(x.device(), causal_softmax_forward, x, y, rows, t, scale);
  record_op("CausalSoftmaxBackward", {scores}, {y}, [y = y.detach(), rows, t, scale](const std::vector<Tensor>& g) {
    Tensor gx = Tensor::empty(y.shape(), y.options());
    DPT_KERNEL_DISPATCH(y.device(), causal_softmax_backward, g[0].contiguous(), y, gx, rows, t, scale);
    return std::vector<Tensor>{gx};
  });
  return y;
}

}  // namespace dpt
