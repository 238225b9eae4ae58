#include "core/ops_norm.h"

#include "core/autograd.h"
#include "core/error.h"
#include "core/kernel_dispatch.h"
#include "core/norm_kernels.h"

namespace dpt {

namespace {

// Per-row statistics: float32, or float64 for float64 input.
DType stats_dtype(DType input) { return input == DType::Float64 ? DType::Float64 : DType::Float32; }

}  // namespace

Tensor layer_norm(const Tensor& x_in, const Tensor& weight, const Tensor& bias, double eps) {
  DPT_CHECK(x_in.dim() >= 1 && weight.dim() == 1 && bias.dim() == 1 && x_in.size(-1) == weight.size(0) &&
                bias.size(0) == weight.size(0),
            "layer_norm: input {} does not fit weight {} and bias {}", shape_str(x_in.shape()),
            shape_str(weight.shape()), shape_str(bias.shape()));
  DPT_CHECK(x_in.device() == weight.device() && x_in.device() == bias.device(),
            "layer_norm: input on {}, weight on {}, bias on {}", x_in.device().str(), weight.device().str(),
            bias.device().str());
  DPT_CHECK(is_floating(x_in.dtype()) && weight.dtype() == bias.dtype(),
            "layer_norm: input {} with weight {} and bias {}", dtype_name(x_in.dtype()), dtype_name(weight.dtype()),
            dtype_name(bias.dtype()));
  Tensor x = x_in.contiguous();
  int64_t n = x.size(-1);
  int64_t rows = n == 0 ? 0 : x.numel() / n;
  TensorOptions stats = x.options().with_dtype(stats_dtype(x.dtype()));
  Tensor y = Tensor::empty(x.shape(), x.options());
  Tensor mean = Tensor::empty({rows}, stats);
  Tensor rstd = Tensor::empty({rows}, stats);
  DPT_KERNEL_DISPATCH(x.device(), layer_norm_forward, x, weight.contiguous(), bias.contiguous(), y, mean, rstd, rows, n,
                      eps);
  record_op("LayerNormBackward", {x_in, weight, bias}, {y},
            [x = x.detach(), w = weight.detach(), mean, rstd, rows, n](const std::vector<Tensor>& g) {
              Tensor gy = g[0].contiguous();
              Tensor gx = Tensor::empty(x.shape(), x.options());
              Tensor gw = Tensor::empty(w.shape(), w.options());
              Tensor gb = Tensor::empty(w.shape(), w.options());
              DPT_KERNEL_DISPATCH(x.device(), layer_norm_backward, gy, x, w.contiguous(), mean, rstd, gx, gw, gb, rows,
                                  n);
              return std::vector<Tensor>{gx, gw, gb};
            });
  return y;
}

}  // namespace dpt
