// Float64 finite-difference checks of every layer and loss, with respect to inputs and parameters.
#include <gtest/gtest.h>

#include "core/factory.h"
#include "core/ops.h"
#include "layers/activation.h"
#include "layers/attention.h"
#include "layers/dropout.h"
#include "layers/embedding.h"
#include "layers/gpt.h"
#include "layers/layer_norm.h"
#include "layers/linear.h"
#include "layers/losses.h"
#include "layers/mlp.h"
#include "layers/transformer_block.h"
#include "param_gradcheck.h"

namespace dpt::nn {
namespace {

using dpt::testing::expect_param_gradients_match;
using dpt::testing::leaf64;

const TensorOptions kF64 = TensorOptions{}.with_dtype(DType::Float64);
const TensorOptions kI64 = TensorOptions{}.with_dtype(DType::Int64);

// Parameters of `m` plus the extra leaves, for the checker.
NamedTensors with_inputs(const Module& m, const NamedTensors& inputs) {
  NamedTensors all = m.named_parameters();
  for (const auto& e : inputs) all.push_back(e);
  return all;
}

// Moves a module to float64 and perturbs LayerNorm-style constant parameters so that every
// parameter's gradient is exercised away from the special point (1, 0).
void to_f64_randomized(Module& m, Generator& gen) {
  m.to(DType::Float64);
  for (auto& [n, p] : m.named_parameters()) {
    Tensor noise = randn(p.shape(), gen, kF64, 0.0, 0.3);
    Tensor q = p;
    q.copy_(add(p.detach(), noise));
  }
}

TEST(LayerGradients, Linear) {
  Generator gen(1);
  Linear lin(4, 3, true, gen);
  to_f64_randomized(lin, gen);
  Tensor x = leaf64({2, 5, 4}, gen);  // leading batch dims
  expect_param_gradients_match([&] { return lin.forward(x); }, with_inputs(lin, {{"x", x}}));
  Linear nobias(3, 2, false, gen);
  to_f64_randomized(nobias, gen);
  Tensor v = leaf64({3}, gen);  // a single vector
  expect_param_gradients_match([&] { return nobias.forward(v); }, with_inputs(nobias, {{"v", v}}));
}

TEST(LayerGradients, Embedding) {
  Generator gen(2);
  Embedding emb(6, 3, gen);
  emb.to(DType::Float64);
  Tensor idx = from_vector<int64_t>({0, 5, 2, 2, 1, 0}, {2, 3}, kI64);  // repeats accumulate
  expect_param_gradients_match([&] { return emb.forward(idx); }, emb.named_parameters());
}

TEST(LayerGradients, LayerNorm) {
  Generator gen(3);
  LayerNorm ln(5);
  to_f64_randomized(ln, gen);
  Tensor x = leaf64({3, 2, 5}, gen);
  expect_param_gradients_match([&] { return ln.forward(x); }, with_inputs(ln, {{"x", x}}));
}

TEST(LayerGradients, Activations) {
  Generator gen(4);
  Tensor x = leaf64({4, 5}, gen);
  for (const char* name : {"relu", "gelu", "tanh"}) {
    auto act = make_activation(name);
    SCOPED_TRACE(name);
    expect_param_gradients_match([&] { return act->forward(x); }, {{"x", x}});
  }
}

TEST(LayerGradients, DropoutWithAFixedMask) {
  Generator gen(5);
  Tensor x = leaf64({4, 6}, gen);
  Generator drop_gen(99);
  Dropout drop(0.4, drop_gen);
  // Re-seat the generator before each forward so every evaluation draws the same mask.
  expect_param_gradients_match([&] {
    drop_gen.set_state(99, 0);
    return drop.forward(x);
  }, {{"x", x}});
}

TEST(LayerGradients, MLP) {
  Generator gen(6);
  MLP mlp({3, 5, 4, 2}, "tanh", gen);
  to_f64_randomized(mlp, gen);
  Tensor x = leaf64({4, 3}, gen);
  expect_param_gradients_match([&] { return mlp.forward(x); }, with_inputs(mlp, {{"x", x}}));
}

TEST(LayerGradients, CausalSelfAttention) {
  Generator gen(7);
  CausalSelfAttention attn(4, 2, 0.0, gen);
  to_f64_randomized(attn, gen);
  Tensor x = leaf64({2, 3, 4}, gen);
  expect_param_gradients_match([&] { return attn.forward(x); }, with_inputs(attn, {{"x", x}}));
}

TEST(LayerGradients, TransformerBlock) {
  Generator gen(8);
  TransformerBlock block(4, 2, 0.0, gen);
  to_f64_randomized(block, gen);
  Tensor x = leaf64({1, 3, 4}, gen);
  expect_param_gradients_match([&] { return block.forward(x); }, with_inputs(block, {{"x", x}}));
}

TEST(LayerGradients, GptLossThroughEveryParameter) {
  GPTConfig cfg;
  cfg.vocab_size = 7;
  cfg.block_size = 4;
  cfg.n_layer = 1;
  cfg.n_head = 2;
  cfg.n_embd = 4;
  Generator gen(9);
  GPT gpt(cfg, gen);
  to_f64_randomized(gpt, gen);
  Tensor idx = from_vector<int64_t>({1, 6, 3, 0, 2, 2}, {2, 3}, kI64);
  Tensor targets = from_vector<int64_t>({6, 3, 0, 2, -100, 5}, {2, 3}, kI64);  // one ignored target
  expect_param_gradients_match([&] { return gpt.loss(idx, targets); }, gpt.named_parameters());
}

TEST(LayerGradients, Losses) {
  Generator gen(10);
  Tensor logits = leaf64({2, 3, 5}, gen);
  Tensor targets = from_vector<int64_t>({4, 0, -100, 2, 2, 1}, {2, 3}, kI64);
  expect_param_gradients_match([&] { return cross_entropy_loss(logits, targets); }, {{"logits", logits}});
  Tensor pred = leaf64({3, 4}, gen);
  Tensor target = randn({3, 4}, gen, kF64);
  expect_param_gradients_match([&] { return mse(pred, target); }, {{"pred", pred}});
}

}  // namespace
}  // namespace dpt::nn
