#pragma once
// dpt::linear's fused CUDA form in pieces (core/ops_linear.cpp holds the math and the choices), for an
// autograd op that keeps the fused forward and the activation's fused backward but forms W's and b's
// gradients some other way (distributed/gathered_linear_zero.cpp forms them from every rank's rows).
// dpt::linear itself is built from these pieces.
#include <cstdint>
#include <memory>

#include "core/ops.h"

namespace dpt {

// What a fused forward keeps for backward, all detached.
struct FusedLinear {
  Tensor x, weight, bias;  // x: the [m, k] contiguous input rows
  Tensor weight_leaf;      // set by dpt::linear when W is a leaf: dW may go straight into its gradient buffer
  Tensor bias_leaf;        // likewise for the bias and db (core/autograd.h grad_out_for)
  Tensor aux;              // GELU: pre-activation [m, n]; ReLU: bit mask (DRELU reads it); None: undefined
  Tensor out;              // ReLU only: the [m, n] output its elementwise backward reads. Other activations keep
                           // no reference to it, so a big output (a language-model head's logits) is freed as
                           // soon as its consumers are done with it instead of living until this op's backward.
  TensorOptions options;   // dtype and device of out and of the gradients
  Activation act = Activation::None;
  bool gelu_after = false;  // float32 GELU: core's GELU kernel after the GEMM
  int64_t m = 0, n = 0, k = 0;
};

// act(x W^T + b), plus `residual` inside the GEMM when defined (act None only), into *out; keeps what
// backward needs when `for_backward`. Null when the fused path cannot run (no CUDA device, the fused path
// off, a dtype or layout cuBLASLt cannot take): the caller composes from core's ops instead.
std::shared_ptr<FusedLinear> fused_linear_forward(const Tensor& x, const Tensor& weight, const Tensor& bias,
                                                  Activation act, bool for_backward, Tensor* out,
                                                  const Tensor& residual = {});

// The output gradient as the [m, n] rows backward works on, in the forward's dtype.
Tensor fused_linear_rows(const FusedLinear& s, const Tensor& grad_out);

// dpre = dy * act'(pre) in one pass, dy itself for act None. Given `gb`, that pass also forms the bias
// gradient when its kernel takes the case (*gb then defined: it may be the bias's gradient buffer, see
// core/autograd.h grad_formed).
Tensor fused_linear_pre_grad(const FusedLinear& s, const Tensor& dy_rows, Tensor* gb = nullptr);

// Whether a consumer's backward can form this producer's dpre itself (ReLU, while linear_absorb(), core/ops.h).
bool fused_linear_absorbable(const FusedLinear& producer);

// The producer's dpre straight from the consumer's dpre and weight: dh = grad_pre2 W2 through a GEMM whose
// DRELU epilogue reads the producer's bit mask (and, with need_b, forms the producer's bias gradient into
// *gb, as fused_linear_pre_grad does); falls back to the GEMM and the elementwise pass.
Tensor fused_linear_absorbed_pre_grad(const FusedLinear& producer, const Tensor& grad_pre2, const Tensor& w2,
                                      bool need_b, Tensor* gb);

}  // namespace dpt
