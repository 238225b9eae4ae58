#include "layers/linear.h"

#include "core/error.h"
#include "core/ops.h"
#include "layers/init.h"

namespace dpt::nn {

Linear::Linear(int64_t in_features, int64_t out_features, bool with_bias, Generator& gen) {
  DPT_CHECK(in_features > 0 && out_features > 0, "Linear: features must be positive, got in {} out {}", in_features,
            out_features);
  weight = register_parameter("weight", Tensor::empty({out_features, in_features}));
  init::fan_in_uniform_(weight, gen, in_features);
  if (with_bias) {
    bias = register_parameter("bias", Tensor::empty({out_features}));
    init::fan_in_uniform_(bias, gen, in_features);
  }
}

Tensor Linear::forward(const Tensor& x) { return forward_with(x, Activation::None); }

Tensor Linear::forward_with(const Tensor& x, Activation act) {
  DPT_CHECK(x.dim() >= 1 && x.size(-1) == weight.size(1), "Linear: expected input [..., {}], found {}", weight.size(1),
            shape_str(x.shape()));
  // [..., in] @ W^T (+ b), then act; a rank-1 input is treated as one row.
  return op ? op(x, act) : linear(x, weight, bias, act);
}

Tensor Linear::forward_residual(const Tensor& x, const Tensor& residual) {
  DPT_CHECK(x.dim() >= 1 && x.size(-1) == weight.size(1), "Linear: expected input [..., {}], found {}", weight.size(1),
            shape_str(x.shape()));
  return op ? add(residual, op(x, Activation::None)) : linear_residual(x, weight, bias, residual);
}

}  // namespace dpt::nn
