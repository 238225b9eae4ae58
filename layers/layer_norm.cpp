#include "layers/layer_norm.h"

#include "core/error.h"
#include "core/ops_norm.h"

namespace dpt::nn {

LayerNorm::LayerNorm(int64_t dim, double eps, bool with_bias) : eps_(eps) {
  DPT_CHECK(dim > 0, "LayerNorm: dim must be positive, got {}", dim);
  weight = register_parameter("weight", ones({dim}));
  if (with_bias) bias = register_parameter("bias", zeros({dim}));
}

const Tensor& LayerNorm::bias_or_zeros() {
  if (bias.defined()) return bias;
  if (!zero_bias_.defined() || zero_bias_.dtype() != weight.dtype() || zero_bias_.device() != weight.device()) {
    zero_bias_ = zeros(weight.shape(), weight.options());  // never trained: its gradient is dropped
  }
  return zero_bias_;
}

Tensor LayerNorm::forward(const Tensor& x) {
  check_input(x);
  // One fused op (core/ops_norm.h): statistics in float32 for bf16 input, one read and one write of x
  // forward, deterministic weight/bias gradients.
  return layer_norm(x, weight, bias_or_zeros(), eps_);
}

NormAndSkip LayerNorm::forward_and_skip(const Tensor& x) {
  check_input(x);
  return layer_norm_and_skip(x, weight, bias_or_zeros(), eps_);
}

void LayerNorm::check_input(const Tensor& x) const {
  DPT_CHECK(x.dim() >= 1 && x.size(-1) == weight.size(0), "LayerNorm: expected input [..., {}], found {}",
            weight.size(0), shape_str(x.shape()));
}

}  // namespace dpt::nn
