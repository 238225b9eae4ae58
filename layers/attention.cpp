#include "layers/attention.h"

#include <cmath>

#include "core/autograd.h"
#include "core/error.h"
#include "core/ops.h"
#include "core/ops_attention.h"
#include "core/ops_flash_attention.h"

namespace dpt::nn {

CausalSelfAttention::CausalSelfAttention(int64_t n_embd, int64_t n_head, double dropout, Generator& gen, bool bias)
    : n_embd_(n_embd), n_head_(n_head), dropout_(dropout), gen_(&gen) {
  DPT_CHECK(n_head > 0 && n_embd % n_head == 0, "CausalSelfAttention: n_embd {} must be a multiple of n_head {}",
            n_embd, n_head);
  qkv = register_module("qkv", std::make_shared<Linear>(n_embd, 3 * n_embd, bias, gen));
  proj = register_module("proj", std::make_shared<Linear>(n_embd, n_embd, bias, gen));
}

Tensor CausalSelfAttention::attend(const Tensor& x) {
  DPT_CHECK(x.dim() == 3 && x.size(2) == n_embd_, "CausalSelfAttention: expected input [B, T, {}], found {}", n_embd_,
            shape_str(x.shape()));
  const int64_t b = x.size(0), t = x.size(1), h = n_head_, d = n_embd_ / n_head_;
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  // 1. One projection for q, k and v: [B, T, C] -> [B, T, 3C].
  Tensor qkv_out = qkv->forward(x);
  Tensor y;
  const double p = is_training() ? dropout_ : 0.0;
  if (x.device().is_cuda() && (p == 0 || causal_attention_dropout_fused(qkv_out, h))) {
    // 2+3. Fused flash attention on the packed projection (core/ops_flash_attention.h): no [B, H, T, T]
    // scores in memory, and q, k, v read and the heads merged in place, [B, T, 3C] -> [B, T, C]. Dropout
    // on the attention weights is drawn inside the kernels, the mask the composed path below would draw.
    // (Where CUDA has no fused kernel for the case, or DPT_ATTENTION=reference, the op composes itself.)
    y = causal_attention_qkv(qkv_out, n_head_, scale, p, *gen_);
  } else {
    // Split heads: [B, T, C] -> [B, H, T, D].
    std::vector<Tensor> parts = split(qkv_out, {n_embd_, n_embd_, n_embd_}, 2);
    auto heads = [&](const Tensor& p) { return p.reshape({b, t, h, d}).permute({0, 2, 1, 3}); };
    Tensor q = heads(parts[0]), k = heads(parts[1]), v = heads(parts[2]);
    // 2. Scores [B, H, T, T] and the fused scale + causal mask + softmax (core/ops_attention.h).
    Tensor att = causal_softmax(matmul(q, k, false, true), scale);
    att = dropout(att, dropout_, is_training(), *gen_);
    // 3. Weighted values, heads merged back: [B, H, T, D] -> [B, T, C].
    y = matmul(att, v).permute({0, 2, 1, 3}).reshape({b, t, n_embd_});
  }
  return y;
}

Tensor CausalSelfAttention::forward(const Tensor& x) {
  return dropout(proj->forward(attend(x)), dropout_, is_training(), *gen_);
}

Tensor CausalSelfAttention::forward_residual(const Tensor& x, const Tensor& residual) {
  if (is_training() && dropout_ > 0) return dpt::dropout_add(proj->forward(attend(x)), residual, dropout_, *gen_);
  return proj->forward_residual(attend(x), residual);
}

Tensor CausalSelfAttention::forward_cached(const Tensor& x, KvCache::Layer& cache, int64_t past) {
  DPT_CHECK(!grad_mode_enabled(), "CausalSelfAttention::forward_cached: inference only (use a NoGradGuard)");
  DPT_CHECK(x.dim() == 3 && x.size(2) == n_embd_, "CausalSelfAttention: expected input [B, T, {}], found {}", n_embd_,
            shape_str(x.shape()));
  const int64_t b = x.size(0), t = x.size(1), h = n_head_, d = n_embd_ / n_head_;
  DPT_CHECK(past == 0 || t == 1, "CausalSelfAttention::forward_cached: {} new positions after {} cached ones; "
            "after the first call, one position at a time", t, past);
  std::vector<Tensor> parts = split(qkv->forward(x), {n_embd_, n_embd_, n_embd_}, 2);
  // Cache layout [T, B, H, D]: the new positions' keys and values go into rows past .. past + t - 1.
  auto by_position = [&](const Tensor& p) { return p.reshape({b, t, h, d}).permute({1, 0, 2, 3}); };
  Tensor k_new = by_position(parts[1]), v_new = by_position(parts[2]);
  DPT_CHECK(cache.keys.defined() && past + t <= cache.keys.size(0) && cache.keys.size(1) == b,
            "CausalSelfAttention::forward_cached: {} positions of batch {} do not fit the cache ({})", past + t, b,
            cache.keys.defined() ? shape_str(cache.keys.shape()) : "not allocated");
  cache.keys.slice(past, past + t).copy_(k_new);
  cache.values.slice(past, past + t).copy_(v_new);
  // [T, B, H, D] -> [B, H, T, D] views of every position so far.
  Tensor k = cache.keys.slice(0, past + t).permute({1, 2, 0, 3});
  Tensor v = cache.values.slice(0, past + t).permute({1, 2, 0, 3});
  Tensor q = parts[0].reshape({b, t, h, d}).permute({0, 2, 1, 3});
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  Tensor scores = matmul(q, k, false, true);  // [B, H, t, past + t]
  // The prompt (past 0) is the square causal case; a single new position sees every cached one.
  Tensor att = past == 0 ? causal_softmax(scores, scale) : softmax(scores * scale);
  return proj->forward(matmul(att, v).permute({0, 2, 1, 3}).reshape({b, t, n_embd_}));
}

}  // namespace dpt::nn
