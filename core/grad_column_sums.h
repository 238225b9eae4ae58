#pragma once
// A linear's bias gradient is the column sum of its output's gradient: a pass over [rows, n] that the
// op producing that gradient can do on the way, since it writes every element of it anyway. Flash
// attention's backward does so for the QKV projection of a transformer block (it writes dQKV tile by
// tile, saving one read of dQKV per layer). LayerNorm's backward could do the same for the projections
// into the residual stream, but does not: its kernel already holds two sets of per-column sums in
// registers, and a third costs it more than the separate pass.
//
// The handshake, all through the output tensor's autograd state:
//   1. the linear, in forward, offers: it attaches a GradColumnSums to its output (offer_grad_column_sums);
//   2. an op consuming that very tensor claims it (claim_grad_column_sums; one claimant per offer) and,
//      in its backward, delivers the gradient it returns for that input together with its column sums;
//   3. the linear's backward takes the sums only if the gradient it receives *is* the delivered tensor.
//      Autograd adds the contributions of several consumers out of place (a new tensor), so identity
//      means no other path added to it and the sums are exactly those of the gradient in hand.
//      Otherwise (another consumer, a hook that replaced it) the linear sums the columns itself.
// Every claimant must deliver or not claim.
#include <memory>

#include "core/tensor.h"

namespace dpt {

class GradColumnSums {
 public:
  GradColumnSums(int64_t n, DType dtype) : n_(n), dtype_(dtype) {}

  int64_t columns() const { return n_; }
  DType dtype() const { return dtype_; }  // the sums' dtype: the bias's

  // The claimant's backward: `sums` ([n], dtype()) are the column sums of `grad`.
  void deliver(const Tensor& grad, const Tensor& sums);
  // The offering linear's backward: the delivered sums if `grad` is the delivered tensor, else undefined.
  // Either way the handoff is emptied, so a delivered gradient is not kept alive past this call.
  Tensor take(const Tensor& grad);

 private:
  friend std::shared_ptr<GradColumnSums> claim_grad_column_sums(const Tensor& x);
  int64_t n_;
  DType dtype_;
  bool claimed_ = false;
  Tensor grad_, sums_;
};

// Attaches `offer` to `out` (an op output with a grad_fn). No-op when column-sum handoff is off.
void offer_grad_column_sums(const Tensor& out, const std::shared_ptr<GradColumnSums>& offer);

// The offer attached to `x` if there is one, it is unclaimed, and x is the offering op's output itself
// (not a view of it: a view has autograd state of its own). Marks it claimed.
std::shared_ptr<GradColumnSums> claim_grad_column_sums(const Tensor& x);

// On by default; DPT_GRAD_COLUMN_SUMS=0 or set_grad_column_sums(false) turns offers off, so every
// linear sums its own columns (for comparisons in tests and benchmarks).
void set_grad_column_sums(bool enabled);
bool grad_column_sums_enabled();

}  // namespace dpt
