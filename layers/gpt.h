#pragma once
// GPT-2-style language model: token + position embeddings, n_layer pre-LN blocks, a final LayerNorm,
// and an LM head tied to the token embedding (logits = x wte^T; the matrix is stored once, as
// "wte.weight").
//
// Parameter names: wte.weight, wpe.weight, blocks.{i}.ln1.{weight,bias}, blocks.{i}.attn.qkv.{weight,bias},
// blocks.{i}.attn.proj.{weight,bias}, blocks.{i}.ln2.*, blocks.{i}.mlp.fc.*, blocks.{i}.mlp.proj.*,
// ln_f.{weight,bias} (no `.bias` entries with config.bias false). Linear weights are [out, in] as in
// torch.nn.Linear.
#include "layers/dropout.h"
#include "layers/embedding.h"
#include "layers/kv_cache.h"
#include "layers/layer_norm.h"
#include "layers/module.h"
#include "layers/sequential.h"

namespace dpt::nn {

struct GPTConfig {
  int64_t vocab_size = 50257;
  int64_t block_size = 1024;  // longest sequence (rows of wpe)
  int64_t n_layer = 12;
  int64_t n_head = 12;
  int64_t n_embd = 768;
  double dropout = 0.0;
  bool bias = true;  // false: no biases in the Linears and LayerNorms (nanoGPT's default)
  std::string ffn = "mlp";  // each block's feed-forward, by name (layers/feed_forward.h)
};

class GPT : public Module {
 public:
  // GPT-2 initialization: weights N(0, 0.02), residual projections N(0, 0.02 / sqrt(2 n_layer)),
  // biases 0, LayerNorms (1, 0).
  explicit GPT(const GPTConfig& config, Generator& gen = default_generator());

  // idx: int32/int64 [B, T] with T <= block_size -> logits [B, T, vocab_size].
  Tensor forward(const Tensor& idx) override;
  // The logits of positions cache.length .. cache.length + T - 1 for idx [B, T], reusing the keys and
  // values of the positions before (layers/kv_cache.h) and adding these: the prompt first (an empty
  // cache), then one token at a time, up to block_size positions. The same logits as forward() on the
  // whole sequence. Inference only (no autograd), in eval mode.
  Tensor forward_cached(const Tensor& idx, KvCache& cache);
  // Mean cross-entropy of the next-token predictions against targets [B, T] (ignore_index -100).
  Tensor loss(const Tensor& idx, const Tensor& targets);
  const GPTConfig& config() const { return config_; }

  std::shared_ptr<Embedding> wte, wpe;
  std::shared_ptr<Dropout> drop;
  std::shared_ptr<Sequential> blocks;
  std::shared_ptr<LayerNorm> ln_f;

 private:
  GPTConfig config_;
};

}  // namespace dpt::nn
