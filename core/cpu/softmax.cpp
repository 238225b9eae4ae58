// Row-wise softmax and log-softmax over the last dim, statistics in float (double for float64).
// Each row subtracts its maximum first, so exp never overflows.
#include <algorithm>
#include <cmath>

#include "core/cpu/cpu_kernels.h"
#include "core/cpu/dispatch.h"

namespace dpt::cpu {

void softmax(const Tensor& in, const Tensor& out, int64_t rows, int64_t n, bool log) {
  DPT_CHECK(in.is_contiguous() && out.is_contiguous() && in.numel() == rows * n && out.numel() == rows * n &&
                in.dtype() == out.dtype(),
            "softmax kernel: {} -> {} is not [{}, {}]", shape_str(in.shape()), shape_str(out.shape()), rows, n);
  visit_floating(out.dtype(), "softmax", [&](auto tag) {
    using T = decltype(tag);
    using C = Compute<T>;
    for (int64_t r = 0; r < rows; ++r) {
      const T* x = in.data<T>() + r * n;
      T* y = out.data<T>() + r * n;
      C mx = -INFINITY;
      for (int64_t j = 0; j < n; ++j) mx = std::max(mx, convert<C>(x[j]));
      C total = 0;
      for (int64_t j = 0; j < n; ++j) total += std::exp(convert<C>(x[j]) - mx);
      if (log) {
        C lse = mx + std::log(total);
        for (int64_t j = 0; j < n; ++j) y[j] = convert<T>(convert<C>(x[j]) - lse);
      } else {
        for (int64_t j = 0; j < n; ++j) y[j] = convert<T>(std::exp(convert<C>(x[j]) - mx) / total);
      }
    }
  });
}

void softmax_backward(const Tensor& grad_out, const Tensor& out, const Tensor& grad_in, int64_t rows, int64_t n,
                      bool log) {
  DPT_CHECK(grad_out.is_contiguous() && out.is_contiguous() && grad_in.is_contiguous() &&
                grad_out.numel() == rows * n && out.numel() == rows * n && grad_in.numel() == rows * n,
            "softmax_backward kernel: operands do not view as [{}, {}]", rows, n);
  visit_floating(grad_in.dtype(), "softmax_backward", [&](auto tag) {
    using T = decltype(tag);
    using C = Compute<T>;
    for (int64_t r = 0; r < rows; ++r) {
      const T* gy = grad_out.data<T>() + r * n;
      const T* y = out.data<T>() + r * n;
      T* gx = grad_in.data<T>() + r * n;
      C dot = 0;
      if (log) {
        // y = log p: gx = gy - p * sum(gy).
        for (int64_t j = 0; j < n; ++j) dot += convert<C>(gy[j]);
        for (int64_t j = 0; j < n; ++j) gx[j] = convert<T>(convert<C>(gy[j]) - std::exp(convert<C>(y[j])) * dot);
      } else {
        // y = p: gx = p * (gy - sum(gy * p)).
        for (int64_t j = 0; j < n; ++j) dot += convert<C>(gy[j]) * convert<C>(y[j]);
        for (int64_t j = 0; j < n; ++j) gx[j] = convert<T>(convert<C>(y[j]) * (convert<C>(gy[j]) - dot));
      }
    }
  });
}

}  // namespace dpt::cpu
