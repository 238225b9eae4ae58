#pragma once
// LayerNorm over the last dimension: y = (x - mean) / sqrt(var + eps) * weight + bias, with the biased
// variance (as PyTorch). Statistics are computed in float32 for bfloat16 inputs (and the result cast
// back), because a bf16 mean of hundreds of values loses most of its digits.
#include "layers/module.h"

namespace dpt::nn {

class LayerNorm : public Module {
 public:
  explicit LayerNorm(int64_t dim, double eps = 1e-5);
  Tensor forward(const Tensor& x) override;

  Tensor weight;  // ones
  Tensor bias;    // zeros

 private:
  double eps_;
};

}  // namespace dpt::nn
