#pragma once
// The feed-forward half of a transformer block, chosen by name (GPTConfig::ffn, the config's
// model.gpt.ffn): "mlp" is GPT-2's proj(gelu(fc(x))) (layers/transformer_block.h), "swiglu" LLaMA's
// proj(silu(gate(x)) * up(x)) (layers/swiglu.h). A new one is a module deriving from FeedForwardLayer
// plus one entry in feed_forwards()'s list (layers/feed_forward.cpp): this library is linked statically,
// so a registration object in an unreferenced file would be dropped by the linker. The entry's help is
// what the config reference says of the name, and its parameter count is what the trainer's memory check
// counts before anything is built.
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

struct FeedForwardFactory {
  std::function<std::shared_ptr<FeedForwardLayer>(const FeedForwardArgs&)> build;
  std::function<int64_t(int64_t n_embd, bool bias)> parameters;  // what build() holds, without building it
};
// The built-in feed-forwards, first call registering them in order ("mlp", "swiglu").
Registry<FeedForwardFactory>& feed_forwards();
// feed_forwards()'s `name`, built; throws naming the known ones for an unknown name.
std::shared_ptr<FeedForwardLayer> make_feed_forward(const std::string& name, const FeedForwardArgs& args);
// The parameters feed_forwards()'s `name` holds at width `n_embd`; throws as make_feed_forward does.
int64_t feed_forward_parameters(const std::string& name, int64_t n_embd, bool bias);

}  // namespace dpt::nn
