#pragma once
// The feed-forward half of a transformer block, chosen by name (GPTConfig::ffn, the config's
// model.gpt.ffn): "mlp" is GPT-2's proj(gelu(fc(x))) (layers/transformer_block.h), "swiglu" LLaMA's
// proj(silu(gate(x)) * up(x)) (layers/swiglu.h). A new one is a module deriving from FeedForwardLayer
// plus one line in feed_forwards()'s list (layers/feed_forward.cpp): this library is linked statically,
// so a registration object in an unreferenced file would be dropped by the linker.
#include <functional>
#include <memory>

#include "core/registry.h"
#include "layers/module.h"

namespace dpt::nn {

// x [..., C] -> [..., C]. The output projection's weight is named "proj" (GPT-2's scaled init of residual
// projections finds it by that name).
class FeedForwardLayer : public Module {
 public:
  // residual + forward(x); a layer may fuse the add into its output projection.
  virtual Tensor forward_residual(const Tensor& x, const Tensor& residual);
};

struct FeedForwardArgs {
  int64_t n_embd = 0;
  double dropout = 0.0;  // on the output, while training
  bool bias = true;
  Generator* gen = nullptr;
};

using FeedForwardFactory = std::function<std::shared_ptr<FeedForwardLayer>(const FeedForwardArgs&)>;
// The built-in feed-forwards, first call registering them in order ("mlp", "swiglu").
Registry<FeedForwardFactory>& feed_forwards();
// feed_forwards()'s `name`, built; throws naming the known ones for an unknown name.
std::shared_ptr<FeedForwardLayer> make_feed_forward(const std::string& name, const FeedForwardArgs& args);

}  // namespace dpt::nn
