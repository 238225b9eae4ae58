#include "layers/feed_forward.h"

#include <spdlog/fmt/fmt.h>

#include "core/ops.h"
#include "layers/swiglu.h"
#include "layers/transformer_block.h"

namespace dpt::nn {

Tensor FeedForwardLayer::forward_residual(const Tensor& x, const Tensor& residual) { return residual + forward(x); }

Registry<FeedForwardFactory>& feed_forwards() {
  static Registry<FeedForwardFactory> registry = [] {
    Registry<FeedForwardFactory> r;
    r.add({"mlp",
           "GPT-2: proj(gelu(fc(x))), hidden width 4 n_embd",
           {},
           {[](const FeedForwardArgs& a) { return std::make_shared<FeedForward>(a.n_embd, a.dropout, *a.gen, a.bias); },
            FeedForward::parameter_count}});
    r.add({"swiglu",
           "LLaMA: proj(silu(gate(x)) * up(x)), hidden width 8/3 n_embd (rounded up to a multiple of 8)",
           {},
           {[](const FeedForwardArgs& a) { return std::make_shared<SwiGLU>(a.n_embd, a.dropout, *a.gen, a.bias); },
            SwiGLU::parameter_count}});
    return r;
  }();
  return registry;
}

namespace {
const FeedForwardFactory& known(const std::string& name) {
  const auto* entry = feed_forwards().find(name);
  DPT_CHECK(entry != nullptr, "feed-forward '{}' is unknown; known: {}", name,
            fmt::join(feed_forwards().names(), ", "));
  return entry->make;
}
}  // namespace

std::shared_ptr<FeedForwardLayer> make_feed_forward(const std::string& name, const FeedForwardArgs& args) {
  const FeedForwardFactory& kind = known(name);
  DPT_CHECK(args.gen != nullptr, "feed-forward '{}': no generator to initialise it from", name);
  return kind.build(args);
}

int64_t feed_forward_parameters(const std::string& name, int64_t n_embd, bool bias) {
  return known(name).parameters(n_embd, bias);
}

}  // namespace dpt::nn
