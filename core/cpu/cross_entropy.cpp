// Fused cross-entropy over [rows, classes] logits. Forward keeps only the per-row logsumexp; backward
// rebuilds softmax = exp(logit - logsumexp) from it, so no [rows, classes] probability tensor is saved.
#include <algorithm>
#include <cmath>

#include "core/cpu/cpu_kernels.h"
#include "core/cpu/dispatch.h"

namespace dpt::cpu {

namespace {
template <class I>
bool target_of(const I* targets, int64_t r, int64_t ignore_index, int64_t classes, int64_t* target) {
  int64_t t = static_cast<int64_t>(targets[r]);
  if (t == ignore_index) return false;
  DPT_CHECK(t >= 0 && t < classes, "cross_entropy: target {} of row {} out of range for {} classes", t, r, classes);
  *target = t;
  return true;
}
}  // namespace

void cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index, const Tensor& losses,
                   const Tensor& logsumexp) {
  DPT_CHECK(logits.dim() == 2 && logits.is_contiguous() && targets.is_contiguous() &&
                targets.numel() == logits.size(0) && losses.numel() == logits.size(0) &&
                logsumexp.numel() == logits.size(0) && losses.dtype() == logsumexp.dtype(),
            "cross_entropy kernel: logits {}, targets {}, losses {}", shape_str(logits.shape()),
            shape_str(targets.shape()), shape_str(losses.shape()));
  const int64_t rows = logits.size(0), classes = logits.size(1);
  visit_floating(logits.dtype(), "cross_entropy", [&](auto tag) {
    using T = decltype(tag);
    visit_floating(losses.dtype(), "cross_entropy losses", [&](auto stat_tag) {
      using S = decltype(stat_tag);
      using C = std::conditional_t<std::is_same_v<T, double>, double, float>;
      visit_index(targets.dtype(), "cross_entropy targets", [&](auto itag) {
        using I = decltype(itag);
        const I* tg = targets.data<I>();
        for (int64_t r = 0; r < rows; ++r) {
          const T* x = logits.data<T>() + r * classes;
          C mx = -INFINITY;
          for (int64_t j = 0; j < classes; ++j) mx = std::max(mx, convert<C>(x[j]));
          C total = 0;
          for (int64_t j = 0; j < classes; ++j) total += std::exp(convert<C>(x[j]) - mx);
          C lse = mx + std::log(total);
          int64_t t = 0;
          bool counted = target_of(tg, r, ignore_index, classes, &t);
          logsumexp.data<S>()[r] = convert<S>(lse);
          losses.data<S>()[r] = convert<S>(counted ? lse - convert<C>(x[t]) : C(0));
        }
      });
    });
  });
}

void cross_entropy_backward(const Tensor& logits, const Tensor& targets, int64_t ignore_index, const Tensor& logsumexp,
                            const Tensor& grad_scale, const Tensor& grad_logits) {
  DPT_CHECK(logits.dim() == 2 && logits.is_contiguous() && grad_logits.is_contiguous() &&
                grad_logits.shape() == logits.shape() && grad_logits.dtype() == logits.dtype() &&
                grad_scale.numel() == 1 && grad_scale.dtype() == logsumexp.dtype(),
            "cross_entropy_backward kernel: logits {}, grad_logits {}, grad_scale {}", shape_str(logits.shape()),
            shape_str(grad_logits.shape()), shape_str(grad_scale.shape()));
  const int64_t rows = logits.size(0), classes = logits.size(1);
  visit_floating(logits.dtype(), "cross_entropy_backward", [&](auto tag) {
    using T = decltype(tag);
    visit_floating(logsumexp.dtype(), "cross_entropy_backward stats", [&](auto stat_tag) {
      using S = decltype(stat_tag);
      using C = std::conditional_t<std::is_same_v<T, double>, double, float>;
      const C scale = convert<C>(grad_scale.data<S>()[0]);
      visit_index(targets.dtype(), "cross_entropy_backward targets", [&](auto itag) {
        using I = decltype(itag);
        const I* tg = targets.data<I>();
        for (int64_t r = 0; r < rows; ++r) {
          const T* x = logits.data<T>() + r * classes;
          T* gx = grad_logits.data<T>() + r * classes;
          int64_t t = 0;
          if (!target_of(tg, r, ignore_index, classes, &t)) {
            for (int64_t j = 0; j < classes; ++j) gx[j] = convert<T>(0.0f);
            continue;
          }
          const C lse = convert<C>(logsumexp.data<S>()[r]);
          for (int64_t j = 0; j < classes; ++j) {
            C p = std::exp(convert<C>(x[j]) - lse);
            gx[j] = convert<T>(scale * (p - (j == t ? C(1) : C(0))));
          }
        }
      });
    });
  });
}

// On the CPU the two passes run back to back; the in-place case is safe because the backward reads each
// logit right before writing its gradient, and the forward is done with the row by then.
void cross_entropy_with_grad(const Tensor& logits, const Tensor& targets, int64_t ignore_index,
                             const Tensor& grad_scale, const Tensor& losses, const Tensor& logsumexp,
                             const Tensor& grad_logits) {
  cross_entropy(logits, targets, ignore_index, losses, logsumexp);
  cross_entropy_backward(logits, targets, ignore_index, logsumexp, grad_scale, grad_logits);
}

void scale_unless_one(const Tensor& x, const Tensor& scale) {
  DPT_CHECK(x.is_contiguous() && scale.numel() == 1, "scale_unless_one kernel: x {}, scale {}", shape_str(x.shape()),
            shape_str(scale.shape()));
  double s = 1;
  visit_floating(scale.dtype(), "scale_unless_one scale", [&](auto tag) {
    using S = decltype(tag);
    s = convert<double>(scale.data<S>()[0]);
  });
  if (s == 1) return;
  visit_floating(x.dtype(), "scale_unless_one", [&](auto tag) {
    using T = decltype(tag);
    using C = std::conditional_t<std::is_same_v<T, double>, double, float>;
    T* p = x.data<T>();
    const C c = static_cast<C>(s);
    for (int64_t i = 0; i < x.numel(); ++i) p[i] = convert<T>(convert<C>(p[i]) * c);
  });
}

}  // namespace dpt::cpu
