// Causal attention on the CPU: the reference for the CUDA kernels. Plain loops over (head, query row),
// everything accumulated in double and rounded once on store; the backward recomputes the
// probabilities from the saved logsumexp exactly as the CUDA kernels do (see core/ops_flash_attention.h).
// Operands are addressed through their AttentionLayout (core/attention_layout.h), so the contiguous
// entry points and the packed-QKV ones share one loop nest and give the same bits.
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

// sums[j] = sum over the `rows` rows of the buffer `grad` (rows `width` elements apart) of column j.
void packed_column_sums(const Tensor& grad, int64_t width, int64_t rows, const Tensor& sums) {
  visit_floating(grad.dtype(), "causal_attention backward column sums", [&](auto tag) {
    using T = decltype(tag);
    std::vector<double> acc(static_cast<size_t>(width), 0.0);
    const T* g = grad.data<T>();
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t j = 0; j < width; ++j) acc[static_cast<size_t>(j)] += convert<double>(g[r * width + j]);
    }
    visit_floating(sums.dtype(), "causal_attention backward column sums", [&](auto stag) {
      using S = decltype(stag);
      for (int64_t j = 0; j < width; ++j) sums.data<S>()[j] = convert<S>(acc[static_cast<size_t>(j)]);
    });
  });
}

}  // namespace

void flash_attention_forward_strided(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                                     const Tensor& lse, const AttentionLayouts& at, int64_t bh, int64_t t, int64_t d,
                                     double scale, const AttentionDropout& dropout) {
  DPT_CHECK(dropout.p == 0, "causal_attention (CPU): no fused dropout; the composed path applies it");
  visit_floating(q.dtype(), "causal_attention", [&](auto tag) {
    using T = decltype(tag);
    visit_floating(lse.dtype(), "causal_attention logsumexp", [&](auto ltag) {
      using L = decltype(ltag);
      std::vector<double> s(static_cast<size_t>(t)), acc(static_cast<size_t>(d));
      const int64_t qs = at.q.row_stride, ks = at.k.row_stride, vs = at.v.row_stride, os = at.out.row_stride;
      for (int64_t h = 0; h < bh; ++h) {
        const T* qh = q.data<T>() + at.q.head_start(h);
        const T* kh = k.data<T>() + at.k.head_start(h);
        const T* vh = v.data<T>() + at.v.head_start(h);
        T* oh = out.data<T>() + at.out.head_start(h);
        for (int64_t i = 0; i < t; ++i) {
          // Row i sees keys 0..i: scores, their maximum, then exp-weights and the weighted values.
          double m = -std::numeric_limits<double>::infinity();
          for (int64_t j = 0; j <= i; ++j) {
            s[static_cast<size_t>(j)] = scale * dot(qh + i * qs, kh + j * ks, d);
            m = std::max(m, s[static_cast<size_t>(j)]);
          }
          double l = 0;
          std::fill(acc.begin(), acc.end(), 0.0);
          for (int64_t j = 0; j <= i; ++j) {
            double p = std::exp(s[static_cast<size_t>(j)] - m);
            l += p;
            for (int64_t c = 0; c < d; ++c) acc[static_cast<size_t>(c)] += p * convert<double>(vh[j * vs + c]);
          }
          for (int64_t c = 0; c < d; ++c) oh[i * os + c] = convert<T>(acc[static_cast<size_t>(c)] / l);
          lse.data<L>()[h * t + i] = convert<L>(m + std::log(l));
        }
      }
    });
  });
}

void flash_attention_backward_strided(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                                      const Tensor& grad_out, const Tensor& lse, const Tensor& grad_q,
                                      const Tensor& grad_k, const Tensor& grad_v, const AttentionLayouts& at,
                                      int64_t bh, int64_t t, int64_t d, double scale, const Tensor& grad_sums,
                                      const AttentionDropout& dropout) {
  DPT_CHECK(dropout.p == 0, "causal_attention backward (CPU): no fused dropout; the composed path applies it");
  visit_floating(q.dtype(), "causal_attention backward", [&](auto tag) {
    using T = decltype(tag);
    visit_floating(lse.dtype(), "causal_attention backward logsumexp", [&](auto ltag) {
      using L = decltype(ltag);
      std::vector<double> gk(static_cast<size_t>(t * d)), gv(static_cast<size_t>(t * d)), gq(static_cast<size_t>(d));
      const int64_t qs = at.q.row_stride, ks = at.k.row_stride, vs = at.v.row_stride, os = at.out.row_stride;
      for (int64_t h = 0; h < bh; ++h) {
        const T* qh = q.data<T>() + at.q.head_start(h);
        const T* kh = k.data<T>() + at.k.head_start(h);
        const T* vh = v.data<T>() + at.v.head_start(h);
        const T* oh = out.data<T>() + at.out.head_start(h);
        const T* go_h = grad_out.data<T>() + at.out.head_start(h);
        T* gq_h = grad_q.data<T>() + at.q.head_start(h);
        T* gk_h = grad_k.data<T>() + at.k.head_start(h);
        T* gv_h = grad_v.data<T>() + at.v.head_start(h);
        std::fill(gk.begin(), gk.end(), 0.0);
        std::fill(gv.begin(), gv.end(), 0.0);
        for (int64_t i = 0; i < t; ++i) {
          const double lse_i = convert<double>(lse.data<L>()[h * t + i]);
          const double d_i = dot(go_h + i * os, oh + i * os, d);  // D_i = dO_i . O_i = sum_j p_ij (dO_i . v_j)
          std::fill(gq.begin(), gq.end(), 0.0);
          for (int64_t j = 0; j <= i; ++j) {
            const double p = std::exp(scale * dot(qh + i * qs, kh + j * ks, d) - lse_i);
            const double ds = p * (dot(go_h + i * os, vh + j * vs, d) - d_i);
            for (int64_t c = 0; c < d; ++c) {
              gq[static_cast<size_t>(c)] += scale * ds * convert<double>(kh[j * ks + c]);
              gk[static_cast<size_t>(j * d + c)] += scale * ds * convert<double>(qh[i * qs + c]);
              gv[static_cast<size_t>(j * d + c)] += p * convert<double>(go_h[i * os + c]);
            }
          }
          for (int64_t c = 0; c < d; ++c) gq_h[i * qs + c] = convert<T>(gq[static_cast<size_t>(c)]);
        }
        for (int64_t j = 0; j < t; ++j) {
          for (int64_t c = 0; c < d; ++c) {
            gk_h[j * ks + c] = convert<T>(gk[static_cast<size_t>(j * d + c)]);
            gv_h[j * vs + c] = convert<T>(gv[static_cast<size_t>(j * d + c)]);
          }
        }
      }
    });
  });
  if (grad_sums.defined()) packed_column_sums(grad_q, at.q.row_stride, bh / at.q.heads * t, grad_sums);
}

void flash_attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                             int64_t bh, int64_t t, int64_t d, double scale) {
  flash_attention_forward_strided(q, k, v, out, lse, AttentionLayouts::contiguous(t, d), bh, t, d, scale);
}

void flash_attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                              const Tensor& grad_out, const Tensor& lse, const Tensor& grad_q, const Tensor& grad_k,
                              const Tensor& grad_v, int64_t bh, int64_t t, int64_t d, double scale) {
  flash_attention_backward_strided(q, k, v, out, grad_out, lse, grad_q, grad_k, grad_v,
                                   AttentionLayouts::contiguous(t, d), bh, t, d, scale, Tensor());
}

}  // namespace dpt::cpu
