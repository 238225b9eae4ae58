#include "layers/gpt.h"

#include "core/error.h"
#include "core/ops.h"
#include "layers/init.h"
#include "layers/losses.h"
#include "layers/transformer_block.h"

namespace dpt::nn {

GPT::GPT(const GPTConfig& config, Generator& gen) : config_(config) {
  DPT_CHECK(config.vocab_size > 0 && config.block_size > 0 && config.n_layer > 0,
            "GPT: vocab_size, block_size and n_layer must be positive");
  wte = register_module("wte", std::make_shared<Embedding>(config.vocab_size, config.n_embd, gen));
  wpe = register_module("wpe", std::make_shared<Embedding>(config.block_size, config.n_embd, gen));
  drop = register_module("drop", std::make_shared<Dropout>(config.dropout, gen));
  blocks = register_module("blocks", std::make_shared<Sequential>());
  for (int64_t i = 0; i < config.n_layer; ++i)
    blocks->push_back(
        std::make_shared<TransformerBlock>(config.n_embd, config.n_head, config.dropout, gen, config.bias, config.ffn));
  ln_f = register_module("ln_f", std::make_shared<LayerNorm>(config.n_embd, 1e-5, config.bias));

  // Re-draw every weight in registration order from the same generator: deterministic per seed.
  const double residual_std = init::gpt2_residual_std(config.n_layer);
  for (const auto& [name, p] : named_parameters()) {
    auto ends_with = [&n = name](const std::string& s) {
      return n.size() >= s.size() && n.compare(n.size() - s.size(), s.size(), s) == 0;
    };
    if (name.find("ln") != std::string::npos) continue;  // LayerNorms keep (1, 0)
    if (ends_with(".bias")) {
      init::zeros_(p);
    } else if (ends_with("attn.proj.weight") || ends_with("mlp.proj.weight")) {
      init::normal_(p, gen, 0.0, residual_std);
    } else {
      init::normal_(p, gen, 0.0, init::kGpt2Std);
    }
  }
}

Tensor GPT::forward(const Tensor& idx) {
  DPT_CHECK(idx.dim() == 2, "GPT: expected token ids [B, T], found {}", shape_str(idx.shape()));
  const int64_t t = idx.size(1);
  DPT_CHECK(t <= config_.block_size, "GPT: sequence length {} exceeds block_size {}", t, config_.block_size);
  Tensor pos = arange(t, TensorOptions{}.with_dtype(DType::Int64).with_device(idx.device()));
  Tensor x = drop->forward(wte->forward(idx) + wpe->forward(pos));  // [B, T, C] + [T, C]
  x = ln_f->forward(blocks->forward(x));
  return matmul(x, wte->weight, false, true);  // tied head: [B, T, C] @ [V, C]^T
}

Tensor GPT::forward_cached(const Tensor& idx, KvCache& cache) {
  DPT_CHECK(idx.dim() == 2, "GPT: expected token ids [B, T], found {}", shape_str(idx.shape()));
  DPT_CHECK(!is_training(), "GPT::forward_cached: call eval() first (no dropout in a cached forward)");
  const int64_t b = idx.size(0), t = idx.size(1), past = cache.length;
  DPT_CHECK(past + t <= config_.block_size, "GPT: {} cached and {} new positions exceed block_size {}", past, t,
            config_.block_size);
  if (cache.layers.empty()) {
    const int64_t d = config_.n_embd / config_.n_head;
    const TensorOptions options = wte->weight.options();
    cache.layers.resize(static_cast<size_t>(config_.n_layer));
    for (KvCache::Layer& layer : cache.layers) {
      layer.keys = zeros({config_.block_size, b, config_.n_head, d}, options);
      layer.values = zeros({config_.block_size, b, config_.n_head, d}, options);
    }
  }
  Tensor pos = arange(past + t, TensorOptions{}.with_dtype(DType::Int64).with_device(idx.device())).slice(past, past + t);
  Tensor x = wte->forward(idx) + wpe->forward(pos);
  for (size_t i = 0; i < blocks->size(); ++i) {
    x = static_cast<TransformerBlock&>((*blocks)[i]).forward_cached(x, cache.layers[i], past);
  }
  cache.length = past + t;
  return matmul(ln_f->forward(x), wte->weight, false, true);
}

Tensor GPT::loss(const Tensor& idx, const Tensor& targets) { return cross_entropy_loss(forward(idx), targets); }

}  // namespace dpt::nn
