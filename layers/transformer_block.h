#pragma once
// Pre-LN transformer block (GPT-2): x = x + attn(ln1(x)); x = x + mlp(ln2(x)), where mlp is the
// feed-forward named by `ffn` (layers/feed_forward.h): by default GPT-2's proj(gelu(fc(x))) with a 4x
// hidden width.
#include <string>

#include "layers/attention.h"
#include "layers/feed_forward.h"
#include "layers/layer_norm.h"
#include "layers/linear.h"
#include "layers/module.h"

namespace dpt::nn {

class FeedForward : public FeedForwardLayer {
 public:
  FeedForward(int64_t n_embd, double dropout = 0.0, Generator& gen = default_generator(), bool bias = true);
  static int64_t parameter_count(int64_t n_embd, bool bias);
  Tensor forward(const Tensor& x) override;
  // residual + forward(x), the add inside proj's GEMM when there is no dropout to apply first, inside
  // the dropout kernel when there is (dpt::dropout_add).
  Tensor forward_residual(const Tensor& x, const Tensor& residual) override;

  std::shared_ptr<Linear> fc;    // C -> 4C
  std::shared_ptr<Linear> proj;  // 4C -> C, writes into the residual stream

 private:
  double dropout_;
  Generator* gen_;
};

class TransformerBlock : public Module {
 public:
  // bias false: no biases in the Linears and LayerNorms (nanoGPT's bias=False).
  TransformerBlock(int64_t n_embd, int64_t n_head, double dropout = 0.0, Generator& gen = default_generator(),
                   bool bias = true, const std::string& ffn = "mlp");
  Tensor forward(const Tensor& x) override;
  // Inference with a KV cache: see CausalSelfAttention::forward_cached.
  Tensor forward_cached(const Tensor& x, KvCache::Layer& cache, int64_t past);

  std::shared_ptr<LayerNorm> ln1;
  std::shared_ptr<CausalSelfAttention> attn;
  std::shared_ptr<LayerNorm> ln2;
  std::shared_ptr<FeedForwardLayer> mlp;  // named "mlp" whatever its kind, as GPT-2's state dict
};

}  // namespace dpt::nn
