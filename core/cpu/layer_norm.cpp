// LayerNorm on the CPU: per row, statistics in double (exact enough to serve as the reference for the
// CUDA kernel), outputs rounded once to the tensor's dtype.
#include <cmath>
#include <type_traits>
#include <vector>

#include "core/cpu/dispatch.h"
#include "core/norm_kernels.h"

namespace dpt::cpu {

namespace {
// Statistics dtype of the op (core/ops_norm.cpp): float64 rows keep float64 statistics, others float32.
template <class T>
using Stats = std::conditional_t<std::is_same_v<T, double>, double, float>;
}  // namespace

void layer_norm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& y, const Tensor& mean,
                        const Tensor& rstd, int64_t rows, int64_t n, double eps) {
  visit_floating(x.dtype(), "layer_norm", [&](auto xt) {
    using T = decltype(xt);
    using S = Stats<T>;
    visit_floating(weight.dtype(), "layer_norm weight", [&](auto wt) {
      using W = decltype(wt);
      const T* px = x.data<T>();
      const W* pw = weight.data<W>();
      const W* pb = bias.data<W>();
      T* py = y.data<T>();
      for (int64_t r = 0; r < rows; ++r) {
        const T* row = px + r * n;
        double sum = 0;
        for (int64_t i = 0; i < n; ++i) sum += convert<double>(row[i]);
        double mu = sum / static_cast<double>(n);
        double sq = 0;
        for (int64_t i = 0; i < n; ++i) {
          double d = convert<double>(row[i]) - mu;
          sq += d * d;
        }
        double rs = 1.0 / std::sqrt(sq / static_cast<double>(n) + eps);
        mean.data<S>()[r] = convert<S>(mu);
        rstd.data<S>()[r] = convert<S>(rs);
        for (int64_t i = 0; i < n; ++i) {
          double v = (convert<double>(row[i]) - mu) * rs * convert<double>(pw[i]) + convert<double>(pb[i]);
          py[r * n + i] = convert<T>(v);
        }
      }
    });
  });
}

void layer_norm_backward(const Tensor& grad_y, const Tensor& x, const Tensor& weight, const Tensor& mean,
                         const Tensor& rstd, const Tensor& grad_x, const Tensor& grad_weight, const Tensor& grad_bias,
                         int64_t rows, int64_t n, const Tensor& grad_add) {
  visit_floating(x.dtype(), "layer_norm backward", [&](auto xt) {
    using T = decltype(xt);
    using S = Stats<T>;
    visit_floating(weight.dtype(), "layer_norm backward weight", [&](auto wt) {
      using W = decltype(wt);
      std::vector<double> gw(static_cast<size_t>(n), 0.0), gb(static_cast<size_t>(n), 0.0);
      const W* pw = weight.data<W>();
      for (int64_t r = 0; r < rows; ++r) {
        const T* px = x.data<T>() + r * n;
        const T* pgy = grad_y.data<T>() + r * n;
        double mu = convert<double>(mean.data<S>()[r]);
        double rs = convert<double>(rstd.data<S>()[r]);
        double mean_g = 0, mean_gx = 0;
        for (int64_t i = 0; i < n; ++i) {
          double xhat = (convert<double>(px[i]) - mu) * rs;
          double g = convert<double>(pgy[i]) * convert<double>(pw[i]);
          mean_g += g;
          mean_gx += g * xhat;
          gw[i] += convert<double>(pgy[i]) * xhat;
          gb[i] += convert<double>(pgy[i]);
        }
        mean_g /= static_cast<double>(n);
        mean_gx /= static_cast<double>(n);
        T* pgx = grad_x.data<T>() + r * n;
        const T* pga = grad_add.defined() ? grad_add.data<T>() + r * n : nullptr;
        for (int64_t i = 0; i < n; ++i) {
          double xhat = (convert<double>(px[i]) - mu) * rs;
          double g = convert<double>(pgy[i]) * convert<double>(pw[i]);
          pgx[i] = convert<T>(rs * (g - mean_g - xhat * mean_gx) + (pga ? convert<double>(pga[i]) : 0.0));
        }
      }
      for (int64_t i = 0; i < n; ++i) {
        grad_weight.data<W>()[i] = convert<W>(gw[i]);
        grad_bias.data<W>()[i] = convert<W>(gb[i]);
      }
    });
  });
}

}  // namespace dpt::cpu
