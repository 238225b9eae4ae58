#pragma once
// SwiGLU feed-forward (Shazeer 2020, "GLU Variants Improve Transformer"; LLaMA's MLP):
//   proj(silu(gate(x)) * up(x)),  silu(z) = z * sigmoid(z)
// Three matrices instead of two, so the hidden width is 2/3 of the GELU MLP's 4C to keep the parameter
// count: 8C/3, rounded up to a multiple of 8 for friendlier GEMM shapes.
#include "layers/feed_forward.h"
#include "layers/linear.h"

namespace dpt::nn {

class SwiGLU : public FeedForwardLayer {
 public:
  SwiGLU(int64_t n_embd, double dropout = 0.0, Generator& gen = default_generator(), bool bias = true);
  Tensor forward(const Tensor& x) override;
  Tensor forward_residual(const Tensor& x, const Tensor& residual) override;
  static int64_t hidden_width(int64_t n_embd);
  static int64_t parameter_count(int64_t n_embd, bool bias);

  std::shared_ptr<Linear> gate;  // C -> H
  std::shared_ptr<Linear> up;    // C -> H
  std::shared_ptr<Linear> proj;  // H -> C, writes into the residual stream

 private:
  Tensor hidden(const Tensor& x);
  double dropout_;
  Generator* gen_;
};

}  // namespace dpt::nn
