#pragma once
// RMSNorm over the last dimension (Zhang & Sennrich 2019): y = x / sqrt(mean(x^2) + eps) * weight.
// LayerNorm without the mean subtraction and the bias; LLaMA-style models use it. Built from existing
// differentiable ops, so its backward comes from autograd: the worked example of adding a layer (README).
// For bfloat16 and float16 input the statistics are computed in float32 and the result cast back, as
// LayerNorm does.
#include "layers/module.h"

namespace dpt::nn {

// The functional form: x [..., D], weight [D].
Tensor rms_norm(const Tensor& x, const Tensor& weight, double eps = 1e-6);

class RMSNorm : public Module {
 public:
  explicit RMSNorm(int64_t dim, double eps = 1e-6);
  Tensor forward(const Tensor& x) override;
  Tensor weight;  // ones, named "weight" as in torch.nn.RMSNorm

 private:
  double eps_;
};

}  // namespace dpt::nn
