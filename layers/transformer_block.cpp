#include "layers/transformer_block.h"

#include "core/ops.h"
#include "layers/dropout.h"

namespace dpt::nn {

FeedForward::FeedForward(int64_t n_embd, double dropout, Generator& gen, bool bias) : dropout_(dropout), gen_(&gen) {
  fc = register_module("fc", std::make_shared<Linear>(n_embd, 4 * n_embd, bias, gen));
  proj = register_module("proj", std::make_shared<Linear>(4 * n_embd, n_embd, bias, gen));
}

int64_t FeedForward::parameter_count(int64_t n_embd, bool bias) {
  return 8 * n_embd * n_embd + (bias ? 5 * n_embd : 0);  // fc C x 4C (+ 4C), proj 4C x C (+ C)
}

Tensor FeedForward::forward(const Tensor& x) {
  // gelu fused into fc's GEMM, and its backward into proj's (dpt::linear).
  return dropout(proj->forward(fc->forward_with(x, Activation::Gelu)), dropout_, is_training(), *gen_);
}

Tensor FeedForward::forward_residual(const Tensor& x, const Tensor& residual) {
  if (is_training() && dropout_ > 0) {
    return dpt::dropout_add(proj->forward(fc->forward_with(x, Activation::Gelu)), residual, dropout_, *gen_);
  }
  return proj->forward_residual(fc->forward_with(x, Activation::Gelu), residual);
}

TransformerBlock::TransformerBlock(int64_t n_embd, int64_t n_head, double dropout, Generator& gen, bool bias,
                                   const std::string& ffn) {
  ln1 = register_module("ln1", std::make_shared<LayerNorm>(n_embd, 1e-5, bias));
  attn = register_module("attn", std::make_shared<CausalSelfAttention>(n_embd, n_head, dropout, gen, bias));
  ln2 = register_module("ln2", std::make_shared<LayerNorm>(n_embd, 1e-5, bias));
  mlp = register_module("mlp", make_feed_forward(ffn, FeedForwardArgs{n_embd, dropout, bias, &gen}));
}

Tensor TransformerBlock::forward(const Tensor& x) {
  // x + attn(ln1(x)), then h + mlp(ln2(h)). Each add runs inside the branch's output projection, and
  // each skip connection's gradient joins the branch's inside the LayerNorm backward.
  const auto [a, x_skip] = ln1->forward_and_skip(x);
  Tensor h = attn->forward_residual(a, x_skip);
  const auto [m, h_skip] = ln2->forward_and_skip(h);
  return mlp->forward_residual(m, h_skip);
}

Tensor TransformerBlock::forward_cached(const Tensor& x, KvCache::Layer& cache, int64_t past) {
  Tensor h = x + attn->forward_cached(ln1->forward(x), cache, past);
  return h + mlp->forward(ln2->forward(h));
}

}  // namespace dpt::nn
