// model.kind gpt: GPT-2 (layers/gpt.h) on token data, sized by the flat keys model.gpt.* (which predate the
// registry, so it registers no settings); the vocabulary and context default to the data's.
#include <spdlog/fmt/fmt.h>

#include "components.h"
#include "core/error.h"
#include "core/flags.h"
#include "core/ops_flash_attention.h"
#include "layers/feed_forward.h"
#include "layers/flops.h"
#include "layers/gpt.h"

namespace dpt::train {
namespace {

// What the factory builds and the estimate counts.
nn::GPTConfig gpt_config(const GptConfig& g, const DataShape& shape) {
  nn::GPTConfig gc;
  gc.vocab_size = g.vocab_size > 0 ? g.vocab_size : shape.vocab_size;
  gc.block_size = g.block_size > 0 ? g.block_size : shape.seq_len;
  gc.n_layer = g.n_layer;
  gc.n_head = g.n_head;
  gc.n_embd = g.n_embd;
  gc.dropout = g.dropout;
  gc.bias = g.bias;
  gc.ffn = g.ffn;
  return gc;
}

ModelParts make_gpt(const Config& config, const Settings&, const DataShape& shape, Generator& gen) {
  const nn::GPTConfig gc = gpt_config(config.model.gpt, shape);
  DPT_CHECK(gc.vocab_size >= shape.vocab_size,
            "model.gpt.vocab_size: the data holds token ids up to {}, so at least {} is needed, got {}",
            shape.vocab_size - 1, shape.vocab_size, gc.vocab_size);
  ModelParts parts;
  parts.module = std::make_shared<nn::GPT>(gc, gen);
  parts.loss = [](nn::Module& m, const data::Batch& batch, DType) {
    return static_cast<nn::GPT&>(m).loss(batch.input, batch.target);
  };
  parts.flops_per_unit =
      nn::gpt_flops_per_token(parts.module->num_parameters(), gc.n_layer, gc.n_embd, shape.seq_len, gc.block_size);
  parts.description = fmt::format("gpt: {} layers, {} heads, width {}, vocab {}, context {}{}{}{}", gc.n_layer,
                                  gc.n_head, gc.n_embd, gc.vocab_size, gc.block_size, gc.bias ? "" : ", no biases",
                                  gc.ffn == "mlp" ? "" : ", " + gc.ffn + " feed-forward",
                                  gc.dropout > 0 ? fmt::format(", dropout {:g}", gc.dropout) : "");
  return parts;
}

// On a GPU, bfloat16 attention with a head size the fused kernels take runs fused
// (core/ops_flash_attention.h): no [T x T] scores kept. Other dtypes and head sizes, and
// DPT_ATTENTION=reference, compose the op and keep them.
bool runs_fused_attention(const nn::GPTConfig& gc, DType compute, const Device& device) {
  return device.is_cuda() && gc.n_head > 0 && gc.n_embd % gc.n_head == 0 &&
         fused_causal_attention_supported(compute, gc.n_embd / gc.n_head) && flag_value(Flag::Attention) != "reference";
}

// wte V x C, wpe T x C, per block two LayerNorms (2C each, C without biases), qkv (3C^2 + 3C), proj
// (C^2 + C) and the feed-forward (its registry entry counts it, layers/feed_forward.h), then ln_f; the
// head is tied to wte.
// Activations kept per token and layer: the block's inputs and outputs of LayerNorms, qkv, attention,
// projections and the MLP's 4C-wide hidden (about 18 C values); without fused attention (the CPU, a
// composed case on the GPU, or attention dropout) also the [T x T] scores, softmax and dropout of every head (3 H T
// values). Then the logits (compute dtype) with float32 log-softmax and its gradient (8 bytes each), and one more layer
// of gradients while backward runs through it.
ModelFootprint estimate_gpt(const Config& config, const Settings&, const DataShape& shape, DType compute,
                            const Device& device) {
  const nn::GPTConfig gc = gpt_config(config.model.gpt, shape);
  const double c = static_cast<double>(dtype_size(compute));
  const double v = static_cast<double>(gc.vocab_size), block = static_cast<double>(gc.block_size);
  const double ch = static_cast<double>(gc.n_embd), layers = static_cast<double>(gc.n_layer);
  const double heads = static_cast<double>(gc.n_head), t = static_cast<double>(shape.seq_len);
  const double b = static_cast<double>(config.training.batch_size);
  ModelFootprint out;
  const double ffn = static_cast<double>(nn::feed_forward_parameters(gc.ffn, gc.n_embd, gc.bias));
  const double norm = gc.bias ? 2 * ch : ch;  // a LayerNorm's weight and bias
  const double attention = 4 * ch * ch + (gc.bias ? 4 * ch : 0);
  out.parameters = v * ch + block * ch + layers * (2 * norm + attention + ffn) + norm;
  const double scores = runs_fused_attention(gc, compute, device) && gc.dropout == 0 ? 0 : 3 * heads * t;
  const double per_layer = (18 * ch + scores) * c;
  out.activations = b * t * ((layers + 1) * per_layer + ch * c + v * (c + 8));
  out.keys = fmt::format(
      "model.gpt.n_layer {}, model.gpt.n_embd {}, model.gpt.n_head {}, vocabulary {}, "
      "training.batch_size {}, data.seq_len {}",
      gc.n_layer, gc.n_embd, gc.n_head, gc.vocab_size, config.training.batch_size, shape.seq_len);
  return out;
}

}  // namespace
}  // namespace dpt::train

DPT_REGISTER(dpt::train::models, {"gpt",
                                  "GPT-2: a decoder-only transformer on token data (model.gpt.*)",
                                  {},
                                  {dpt::train::make_gpt, dpt::train::estimate_gpt}})
