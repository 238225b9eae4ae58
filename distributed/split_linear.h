#pragma once
// A Linear layer's op with its weight gradient split off: act(x W^T + b) and dx exactly as dpt::linear forms
// them (the same fused CUDA kernels, core/linear_fused.h), while W and b receive no gradient from autograd.
// Their gradients are dW = dpre^T x and db = colsum(dpre), sums over the batch's rows, so a sink that sees
// x and dpre of every data-parallel rank forms the averaged dW of any rows of W with one GEMM over all
// ranks' rows (distributed/gathered_linear_zero.h). The sink receives, on the calling stream and thread:
//   forward  on_input(x):          the [m, in] rows W multiplies (contiguous, detached);
//   backward on_output_grad(dpre): the [m, out] gradient of x W^T + b (after the activation's derivative).
// W's and b's AccumulateGrad nodes receive nothing, so their grad-ready hooks do not fire. A split linear
// fed directly by another's output absorbs that one's activation backward into its own dx GEMM, as
// dpt::linear does (core/ops_linear.cpp): the producer's dpre comes out of the DRELU epilogue, and
// both sinks are called from the consumer's node, the consumer's first.
#include <memory>
#include <vector>

#include "core/ops.h"

namespace dpt::dist {

class LinearGradSink {
 public:
  virtual ~LinearGradSink() = default;
  virtual void on_input(const Tensor& x) = 0;
  virtual void on_output_grad(const Tensor& dpre) = 0;
};

class SplitLinear {
 public:
  // `weight` and `bias` (may be undefined): the layer's parameters themselves, not copies.
  SplitLinear(Tensor weight, Tensor bias, std::shared_ptr<LinearGradSink> sink);

  // With gradients on (the caller runs dpt::linear otherwise). `producers`: the split linears whose last
  // output x may be.
  Tensor forward(const Tensor& x, Activation act, const std::vector<const SplitLinear*>& producers);

 private:
  struct Absorbable;
  Tensor forward_composed(const Tensor& x, Activation act) const;

  Tensor weight_, bias_;
  std::shared_ptr<LinearGradSink> sink_;
  std::weak_ptr<Absorbable> last_;  // what the last fused forward leaves for a consumer that absorbs it
};

}  // namespace dpt::dist
