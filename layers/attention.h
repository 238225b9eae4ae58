#pragma once
// Causal multi-head self-attention with a fused QKV projection (GPT-2's c_attn).
//   x [B, T, C] -> qkv = x Wqkv^T + b [B, T, 3C] -> q, k, v each [B, H, T, D] (C = H * D)
//   att = softmax(q k^T / sqrt(D) + mask) with mask[i][j] = -1e9 for j > i (position i sees 0..i)
//   y = att v -> [B, T, C] -> proj
// The mask is added rather than applied by selection so the whole layer is built from ops; -1e9 is
// exactly zero after softmax in float32 and bfloat16.

#include "layers/dropout.h"
#include "layers/kv_cache.h"
#include "layers/linear.h"
#include "layers/module.h"

namespace dpt::nn {

class CausalSelfAttention : public Module {
 public:
  CausalSelfAttention(int64_t n_embd, int64_t n_head, double dropout = 0.0, Generator& gen = default_generator(),
                      bool bias = true);
  Tensor forward(const Tensor& x) override;
  // residual + forward(x). Without dropout on the output the add is the output projection's
  // (Linear::forward_residual), with it the dropout kernel's (dpt::dropout_add): one pass over the
  // residual stream fewer either way.
  Tensor forward_residual(const Tensor& x, const Tensor& residual);
  // Inference with a KV cache (layers/kv_cache.h): x [B, t, C] holds positions past .. past + t - 1; their
  // keys and values are written into `cache`, and each query attends to every cached position up to its
  // own. Either the first call (past 0, any t: the prompt) or one new position (t 1). No autograd.
  Tensor forward_cached(const Tensor& x, KvCache::Layer& cache, int64_t past);

  std::shared_ptr<Linear> qkv;
  std::shared_ptr<Linear> proj;

 private:
  Tensor attend(const Tensor& x);  // the heads' outputs merged, [B, T, C], before the projection

  int64_t n_embd_, n_head_;
  double dropout_;
  Generator* gen_;
};

}  // namespace dpt::nn
