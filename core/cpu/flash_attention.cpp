// Causal attention on the CPU: the reference for the CUDA kernels. Plain loops over (head, query row),
// everything accumulated in double and rounded once on store; the backward recomputes the
// probabilities from the saved logsumexp exactly as the CUDA kernels do (see core/ops_flash_attention.h).
#include <cmath>
#include <limits>
#include <vector>

#include "core/cpu/dispatch.h"
#include "core/flash_attention_kernels.h"

namespace dpt::cpu {

namespace {

template <class T>
double dot(const T* a, const T* b, int64_t d) {
  double s = 0;
  for (int64_t c = 0; c < d; ++c) s += convert<double>(a[c]) * convert<double>(b[c]);
  return s;
}

}  // namespace

void flash_attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                             int64_t bh, int64_t t, int64_t d, double scale) {
  visit_floating(q.dtype(), "causal_attention", [&](auto tag) {
    using T = decltype(tag);
    visit_floating(lse.dtype(), "causal_attention logsumexp", [&](auto ltag) {
      using L = decltype(ltag);
      std::vector<double> s(static_cast<size_t>(t)), acc(static_cast<size_t>(d));
      for (int64_t h = 0; h < bh; ++h) {
        const T* qh = q.data<T>() + h * t * d;
        const T* kh = k.data<T>() + h * t * d;
        const T* vh = v.data<T>() + h * t * d;
        T* oh = out.data<T>() + h * t * d;
        for (int64_t i = 0; i < t; ++i) {
          // Row i sees keys 0..i: scores, their maximum, then exp-weights and the weighted values.
          double m = -std::numeric_limits<double>::infinity();
          for (int64_t j = 0; j <= i; ++j) {
            s[static_cast<size_t>(j)] = scale * dot(qh + i * d, kh + j * d, d);
            m = std::max(m, s[static_cast<size_t>(j)]);
          }
          double l = 0;
          std::fill(acc.begin(), acc.end(), 0.0);
          for (int64_t j = 0; j <= i; ++j) {
            double p = std::exp(s[static_cast<size_t>(j)] - m);
            l += p;
            for (int64_t c = 0; c < d; ++c) acc[static_cast<size_t>(c)] += p * convert<double>(vh[j * d + c]);
          }
          for (int64_t c = 0; c < d; ++c) oh[i * d + c] = convert<T>(acc[static_cast<size_t>(c)] / l);
          lse.data<L>()[h * t + i] = convert<L>(m + std::log(l));
        }
      }
    });
  });
}

void flash_attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                              const Tensor& grad_out, const Tensor& lse, const Tensor& grad_q, const Tensor& grad_k,
                              const Tensor& grad_v, int64_t bh, int64_t t, int64_t d, double scale) {
  visit_floating(q.dtype(), "causal_attention backward", [&](auto tag) {
    using T = decltype(tag);
    visit_floating(lse.dtype(), "causal_attention backward logsumexp", [&](auto ltag) {
      using L = decltype(ltag);
      std::vector<double> gk(static_cast<size_t>(t * d)), gv(static_cast<size_t>(t * d)), gq(static_cast<size_t>(d));
      for (int64_t h = 0; h < bh; ++h) {
        const int64_t base = h * t * d;
        const T* qh = q.data<T>() + base;
        const T* kh = k.data<T>() + base;
        const T* vh = v.data<T>() + base;
        const T* oh = out.data<T>() + base;
        const T* go_h = grad_out.data<T>() + base;
        std::fill(gk.begin(), gk.end(), 0.0);
        std::fill(gv.begin(), gv.end(), 0.0);
        for (int64_t i = 0; i < t; ++i) {
          const double lse_i = convert<double>(lse.data<L>()[h * t + i]);
          const double d_i = dot(go_h + i * d, oh + i * d, d);  // D_i = dO_i . O_i = sum_j p_ij (dO_i . v_j)
          std::fill(gq.begin(), gq.end(), 0.0);
          for (int64_t j = 0; j <= i; ++j) {
            const double p = std::exp(scale * dot(qh + i * d, kh + j * d, d) - lse_i);
            const double ds = p * (dot(go_h + i * d, vh + j * d, d) - d_i);
            for (int64_t c = 0; c < d; ++c) {
              gq[static_cast<size_t>(c)] += scale * ds * convert<double>(kh[j * d + c]);
              gk[static_cast<size_t>(j * d + c)] += scale * ds * convert<double>(qh[i * d + c]);
              gv[static_cast<size_t>(j * d + c)] += p * convert<double>(go_h[i * d + c]);
            }
          }
          for (int64_t c = 0; c < d; ++c) grad_q.data<T>()[base + i * d + c] = convert<T>(gq[static_cast<size_t>(c)]);
        }
        for (int64_t e = 0; e < t * d; ++e) {
          grad_k.data<T>()[base + e] = convert<T>(gk[static_cast<size_t>(e)]);
          grad_v.data<T>()[base + e] = convert<T>(gv[static_cast<size_t>(e)]);
        }
      }
    });
  });
}

}  // namespace dpt::cpu
