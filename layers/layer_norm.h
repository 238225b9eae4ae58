#pragma once
// LayerNorm over the last dimension: y = (x - mean) / sqrt(var + eps) * weight + bias, with the biased
// variance (as PyTorch). Statistics are computed in float32 for bfloat16 inputs (and the result cast
// back), because a bf16 mean of hundreds of values loses most of its digits.
#include "core/ops_norm.h"
#include "layers/module.h"

namespace dpt::nn {

class LayerNorm : public Module {
 public:
  // bias false: no bias parameter (y = normalized * weight), as nanoGPT's `bias=False`.
  explicit LayerNorm(int64_t dim, double eps = 1e-5, bool bias = true);
  Tensor forward(const Tensor& x) override;
  // {forward(x), x} for a pre-LN residual block: the skip connection's gradient is then added inside
  // this LayerNorm's backward kernel (dpt::layer_norm_and_skip).
  NormAndSkip forward_and_skip(const Tensor& x);

  Tensor weight;  // ones
  Tensor bias;    // zeros; undefined without bias

 private:
  void check_input(const Tensor& x) const;
  // `bias`, or zeros of the weight's dtype and device for the fused kernels when there is none.
  const Tensor& bias_or_zeros();

  double eps_;
  Tensor zero_bias_;  // made on first use, remade when the weight changes dtype or device
};

}  // namespace dpt::nn
