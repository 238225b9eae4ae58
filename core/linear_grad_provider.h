#pragma once
// A linear layer whose weight and bias gradients another component forms itself.
//
// dpt::linear differentiates act(x W^T + b) into dx = dpre W, dW = dpre^T x and db = colsum(dpre). The
// last two are sums over the batch's rows, so a component that sees x and dpre of every data-parallel
// rank can form the averaged dW of any rows of W with one GEMM over all ranks' rows, instead of each
// rank forming its own dW and the ranks averaging it (distributed/gathered_linear_zero.h). A provider
// registered on W receives, on the calling stream and thread:
//   forward  before_read():        before the op reads W, in any grad mode: a provider that may still be
//                                  writing W (its rows all-gathered after an update) makes the calling
//                                  stream wait for that write;
//            on_input(x):          the [m, in] rows W multiplies (contiguous, detached), only when a
//                                  backward is to follow (grad mode on and something requires grad);
//   backward on_output_grad(dpre): the [m, out] gradient of x W^T + b (after the activation's
//                                  derivative), where the op would have formed dW and db.
// The op then delivers no gradient to W or b: their AccumulateGrad nodes receive none and their
// grad-ready hooks do not fire. dx is unchanged. on_input and on_output_grad come once per forward and
// backward of each use of W; a provider that keeps state between them must not see W used twice in one
// forward.
#include <memory>

#include "core/tensor.h"

namespace dpt {

class LinearGradProvider {
 public:
  virtual ~LinearGradProvider() = default;
  virtual void on_input(const Tensor& x) = 0;
  virtual void on_output_grad(const Tensor& dpre) = 0;
  virtual void before_read() {}
};

// Keyed by W's storage (its data pointer): `weight` must be the very tensor the layer passes to
// dpt::linear, not a copy. The registry holds the provider weakly; null (or the provider's end) removes it.
void set_linear_grad_provider(const Tensor& weight, const std::shared_ptr<LinearGradProvider>& provider);
std::shared_ptr<LinearGradProvider> linear_grad_provider(const Tensor& weight);

}  // namespace dpt
