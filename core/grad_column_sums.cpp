#include "core/grad_column_sums.h"

#include "core/error.h"
#include "core/flags.h"

namespace dpt {

void GradColumnSums::deliver(const Tensor& grad, const Tensor& sums) {
  DPT_CHECK(sums.defined() && sums.dim() == 1 && sums.size(0) == n_ && sums.dtype() == dtype_,
            "grad column sums: expected [{}] {}, found {} {}", n_, dtype_name(dtype_),
            sums.defined() ? shape_str(sums.shape()) : "undefined", sums.defined() ? dtype_name(sums.dtype()) : "");
  grad_ = grad;
  sums_ = sums;
}

Tensor GradColumnSums::take(const Tensor& grad) {
  Tensor sums = grad_.defined() && grad.impl() == grad_.impl() ? sums_ : Tensor();
  grad_ = Tensor();
  sums_ = Tensor();
  return sums;
}

void offer_grad_column_sums(const Tensor& out, const std::shared_ptr<GradColumnSums>& offer) {
  if (!grad_column_sums_enabled() || !out.grad_fn()) return;
  out.impl()->autograd_meta().grad_column_sums = offer;
}

std::shared_ptr<GradColumnSums> claim_grad_column_sums(const Tensor& x) {
  if (!x.defined() || !x.requires_grad() || x.impl()->autograd == nullptr) return nullptr;
  std::shared_ptr<GradColumnSums> offer = x.impl()->autograd->grad_column_sums;
  if (!offer || offer->claimed_) return nullptr;
  offer->claimed_ = true;
  return offer;
}

void set_grad_column_sums(bool enabled) { set_flag(Flag::GradColumnSums, enabled ? "1" : "0"); }
bool grad_column_sums_enabled() { return flag_on(Flag::GradColumnSums); }

}  // namespace dpt
