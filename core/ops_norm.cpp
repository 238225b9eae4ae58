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

namespace {

void check_layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  DPT_CHECK(x.dim() >= 1 && weight.dim() == 1 && bias.dim() == 1 && x.size(-1) == weight.size(0) &&
                bias.size(0) == weight.size(0),
            "layer_norm: input {} does not fit weight {} and bias {}", shape_str(x.shape()), shape_str(weight.shape()),
            shape_str(bias.shape()));
  DPT_CHECK(x.device() == weight.device() && x.device() == bias.device(),
            "layer_norm: input on {}, weight on {}, bias on {}", x.device().str(), weight.device().str(),
            bias.device().str());
  DPT_CHECK(is_floating(x.dtype()) && weight.dtype() == bias.dtype(), "layer_norm: input {} with weight {} and bias {}",
            dtype_name(x.dtype()), dtype_name(weight.dtype()), dtype_name(bias.dtype()));
}

// The forward kernel, and the backward recorded for `outputs`: {y} or {y, skip}. The gradient reaching
// the second output, if any, is added to gx by the backward kernel.
Tensor layer_norm_recorded(const Tensor& x_in, const Tensor& weight, const Tensor& bias, double eps,
                           const Tensor& skip) {
  Tensor x = x_in.contiguous();
  int64_t n = x.size(-1);
  int64_t rows = n == 0 ? 0 : x.numel() / n;
  TensorOptions stats = x.options().with_dtype(stats_dtype(x.dtype()));
  Tensor y = Tensor::empty(x.shape(), x.options());
  Tensor mean = Tensor::empty({rows}, stats);
  Tensor rstd = Tensor::empty({rows}, stats);
  DPT_KERNEL_DISPATCH(x.device(), layer_norm_forward, x, weight.contiguous(), bias.contiguous(), y, mean, rstd, rows, n,
                      eps);
  std::vector<Tensor> outputs{y};
  if (skip.defined()) outputs.push_back(skip);
  // Leaf parameters get their gradients written straight into their buffers (grad_out_for); one tensor
  // passed as both weight and bias gets it through autograd.
  const Tensor weight_leaf = weight.grad_fn() ? Tensor() : weight;
  const Tensor bias_leaf = bias.grad_fn() || bias.impl() == weight.impl() ? Tensor() : bias;
  record_op(skip.defined() ? "LayerNormAndSkipBackward" : "LayerNormBackward", {x_in, weight, bias}, outputs,
            [x = x.detach(), w = weight.detach(), weight_leaf, bias_leaf, mean, rstd, rows,
             n](const std::vector<Tensor>& g) {
              const Tensor add = g.size() > 1 && g[1].defined() ? g[1].to(x.dtype()).contiguous() : Tensor();
              if (!g[0].defined()) return std::vector<Tensor>{add.reshape(x.shape()), Tensor(), Tensor()};
              Tensor gy = g[0].contiguous();
              Tensor gx = Tensor::empty(x.shape(), x.options());
              Tensor gw = grad_out_for(weight_leaf, w.shape(), w.options());
              Tensor gb = grad_out_for(bias_leaf, w.shape(), w.options());
              DPT_KERNEL_DISPATCH(x.device(), layer_norm_backward, gy, x, w.contiguous(), mean, rstd, gx, gw, gb, rows,
                                  n, add);
              return std::vector<Tensor>{gx, grad_formed(weight_leaf, gw), grad_formed(bias_leaf, gb)};
            });
  return y;
}

}  // namespace

Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps) {
  check_layer_norm(x, weight, bias);
  return layer_norm_recorded(x, weight, bias, eps, Tensor());
}

NormAndSkip layer_norm_and_skip(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps) {
  check_layer_norm(x, weight, bias);
  // The skip output shares x's memory; its own autograd identity comes from record_op.
  Tensor skip = x.detach();
  Tensor normed = layer_norm_recorded(x, weight, bias, eps, skip);
  return {normed, skip};
}

}  // namespace dpt
