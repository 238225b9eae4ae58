// Known answers: properties each layer must have whatever its weights.
#include <gtest/gtest.h>

#include <cmath>

#include "core/autograd.h"
#include "core/error.h"
#include "core/factory.h"
#include "core/ops.h"
#include "layers/attention.h"
#include "layers/dropout.h"
#include "layers/gpt.h"
#include "layers/layer_norm.h"
#include "layers/linear.h"
#include "layers/losses.h"

namespace dpt::nn {
namespace {

TEST(LayerKnownAnswers, LayerNormRowsHaveMeanZeroAndVarianceOne) {
  Generator gen(1);
  LayerNorm ln(64);
  Tensor x = randn({5, 64}, gen, {}, 3.0, 7.0);  // far from normalized
  std::vector<float> y = ln.forward(x).to_vector<float>();
  for (int r = 0; r < 5; ++r) {
    double m = 0, v = 0;
    for (int c = 0; c < 64; ++c) m += y[r * 64 + c];
    m /= 64;
    for (int c = 0; c < 64; ++c) v += (y[r * 64 + c] - m) * (y[r * 64 + c] - m);
    v /= 64;
    EXPECT_NEAR(m, 0.0, 1e-5) << r;
    EXPECT_NEAR(v, 1.0, 1e-3) << r;  // eps = 1e-5 against variance 49
  }
}

TEST(LayerKnownAnswers, LinearComputesXWTransposePlusB) {
  Linear lin(2, 3);
  Tensor w = lin.weight, b = lin.bias;
  w.copy_(from_vector<float>({1, 2, 3, 4, 5, 6}, {3, 2}));
  b.copy_(from_vector<float>({0.5f, -1, 0}, {3}));
  Tensor y = lin.forward(from_vector<float>({1, -1, 2, 0}, {2, 2}));
  EXPECT_EQ(y.to_vector<float>(), (std::vector<float>{-0.5f, -2, -1, 2.5f, 5, 10}));
}

TEST(LayerKnownAnswers, CausalAttentionIgnoresTheFuture) {
  Generator gen(2);
  CausalSelfAttention attn(8, 2, 0.0, gen);
  Tensor x = randn({2, 6, 8}, gen);
  std::vector<float> base = attn.forward(x).to_vector<float>();
  // Change every input at positions > t; outputs at positions <= t must not move.
  const int t = 2;
  std::vector<float> xv = x.to_vector<float>();
  for (int b = 0; b < 2; ++b)
    for (int s = t + 1; s < 6; ++s)
      for (int c = 0; c < 8; ++c) xv[(b * 6 + s) * 8 + c] += 10.0f * static_cast<float>(c + 1);
  std::vector<float> changed = attn.forward(from_vector(xv, {2, 6, 8})).to_vector<float>();
  for (int b = 0; b < 2; ++b)
    for (int s = 0; s < 6; ++s)
      for (int c = 0; c < 8; ++c) {
        size_t i = static_cast<size_t>((b * 6 + s) * 8 + c);
        if (s <= t) {
          EXPECT_EQ(changed[i], base[i]) << b << "," << s << "," << c;
        }
      }
  // ...and later positions do move (the change reached them).
  EXPECT_NE(changed[(0 * 6 + 5) * 8], base[(0 * 6 + 5) * 8]);
}

TEST(LayerKnownAnswers, GptOutputAtTDependsOnlyOnTokensUpToT) {
  GPTConfig cfg;
  cfg.vocab_size = 13;
  cfg.block_size = 8;
  cfg.n_layer = 2;
  cfg.n_head = 2;
  cfg.n_embd = 8;
  GPT gpt(cfg);
  auto ids = [](std::vector<int64_t> v) { return from_vector<int64_t>(v, {1, 5}, TensorOptions{}.with_dtype(DType::Int64)); };
  auto a = gpt.forward(ids({1, 2, 3, 4, 5})).to_vector<float>();
  auto b = gpt.forward(ids({1, 2, 3, 9, 12})).to_vector<float>();
  for (size_t i = 0; i < 3 * 13; ++i) EXPECT_EQ(a[i], b[i]) << i;
  EXPECT_THROW(gpt.forward(from_vector<int64_t>(std::vector<int64_t>(9, 0), {1, 9}, TensorOptions{}.with_dtype(DType::Int64))),
               Error);
}

TEST(LayerKnownAnswers, DropoutKeepsExpectedFractionScalesAndIsSeeded) {
  Generator gen(3);
  Dropout drop(0.25, gen);
  Tensor x = ones({100000});
  auto y = drop.forward(x).to_vector<float>();
  size_t kept = 0;
  for (float v : y) {
    ASSERT_TRUE(v == 0.0f || std::abs(v - 1.0f / 0.75f) < 1e-6f) << v;
    kept += v != 0.0f;
  }
  EXPECT_NEAR(static_cast<double>(kept) / 100000.0, 0.75, 0.01);
  // The same generator state gives the same mask; the next call a different one.
  gen.set_state(3, 0);
  EXPECT_EQ(drop.forward(x).to_vector<float>(), y);
  EXPECT_NE(drop.forward(x).to_vector<float>(), y);
  // Eval mode is the identity and draws nothing.
  drop.eval();
  uint64_t offset = gen.offset();
  EXPECT_EQ(drop.forward(x).to_vector<float>(), std::vector<float>(100000, 1.0f));
  EXPECT_EQ(gen.offset(), offset);
}

TEST(LayerKnownAnswers, CrossEntropyOfUniformLogitsIsLogC) {
  Tensor logits = zeros({2, 3, 10});
  Tensor targets = from_vector<int64_t>({1, 2, 3, -100, -100, 9}, {2, 3}, TensorOptions{}.with_dtype(DType::Int64));
  EXPECT_NEAR(cross_entropy_loss(logits, targets).item(), std::log(10.0), 1e-6);
  EXPECT_NEAR(mse(ones({2, 2}), zeros({2, 2})).item(), 1.0, 1e-7);
  EXPECT_THROW(cross_entropy_loss(logits, targets.reshape({6})), Error);
}

TEST(LayerKnownAnswers, Bf16GptForwardIsCloseToFloat32) {
  GPTConfig cfg;
  cfg.vocab_size = 17;
  cfg.block_size = 8;
  cfg.n_layer = 2;
  cfg.n_head = 2;
  cfg.n_embd = 16;
  Generator g1(5), g2(5);
  GPT f32(cfg, g1), b16(cfg, g2);
  b16.to(DType::BFloat16);
  Tensor idx = from_vector<int64_t>({1, 2, 3, 4, 5, 6, 7, 8}, {1, 8}, TensorOptions{}.with_dtype(DType::Int64));
  Tensor targets = from_vector<int64_t>({2, 3, 4, 5, 6, 7, 8, 9}, {1, 8}, TensorOptions{}.with_dtype(DType::Int64));
  double a = f32.loss(idx, targets).item(), b = b16.loss(idx, targets).item();
  EXPECT_NEAR(a, b, 0.02 * a);
}

}  // namespace
}  // namespace dpt::nn
