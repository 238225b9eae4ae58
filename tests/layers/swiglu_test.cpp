// SwiGLU feed-forward: the formula by hand, gradients against finite differences, and its place in a GPT
// block chosen by name (layers/feed_forward.h).
#include "layers/swiglu.h"

#include <gtest/gtest.h>

#include <cmath>

#include "core/error.h"
#include "core/factory.h"
#include "core/ops.h"
#include "layers/gpt.h"
#include "tests/layers/param_gradcheck.h"

namespace dpt::nn {
namespace {

TEST(SwiGLU, HiddenWidthIsTwoThirdsOfFourTimesRoundedUpToEight) {
  EXPECT_EQ(SwiGLU::hidden_width(768), 2048);  // LLaMA-style 8C/3
  EXPECT_EQ(SwiGLU::hidden_width(16), 48);     // 42.67 -> 48
  EXPECT_EQ(SwiGLU::hidden_width(3), 8);
}

TEST(SwiGLU, ForwardIsProjOfSiluGateTimesUp) {
  Generator gen(3);
  SwiGLU ff(4, 0.0, gen);
  Tensor x = randn({2, 3, 4}, gen);
  const std::vector<float> got = ff.forward(x).to_vector<float>();
  // The same numbers from the weights, one element at a time in double.
  const auto wg = ff.gate->weight.to_vector<float>(), bg = ff.gate->bias.to_vector<float>();
  const auto wu = ff.up->weight.to_vector<float>(), bu = ff.up->bias.to_vector<float>();
  const auto wp = ff.proj->weight.to_vector<float>(), bp = ff.proj->bias.to_vector<float>();
  const auto xv = x.to_vector<float>();
  const int64_t h = SwiGLU::hidden_width(4);
  for (int64_t row = 0; row < 6; ++row) {
    std::vector<double> hidden(static_cast<size_t>(h));
    for (int64_t j = 0; j < h; ++j) {
      double g = bg[j], u = bu[j];
      for (int64_t k = 0; k < 4; ++k) {
        g += wg[j * 4 + k] * xv[row * 4 + k];
        u += wu[j * 4 + k] * xv[row * 4 + k];
      }
      hidden[j] = g / (1 + std::exp(-g)) * u;
    }
    for (int64_t o = 0; o < 4; ++o) {
      double y = bp[o];
      for (int64_t j = 0; j < h; ++j) y += wp[o * h + j] * hidden[j];
      EXPECT_NEAR(got[row * 4 + o], y, 1e-5) << row << "," << o;
    }
  }
}

TEST(SwiGLU, ResidualFormAddsTheResidual) {
  Generator gen(4);
  SwiGLU ff(8, 0.0, gen, /*bias=*/false);
  Tensor x = randn({5, 8}, gen), r = randn({5, 8}, gen);
  const auto a = ff.forward_residual(x, r).to_vector<float>();
  const auto b = add(r, ff.forward(x)).to_vector<float>();
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 1e-6) << i;
}

TEST(SwiGLU, GradientsMatchFiniteDifferences) {
  Generator gen(5);
  SwiGLU ff(3, 0.0, gen);
  ff.to(DType::Float64);
  Tensor x = randn({2, 3}, gen, TensorOptions{}.with_dtype(DType::Float64));
  x.requires_grad_(true);
  NamedTensors wrt = ff.named_parameters();
  wrt.push_back({"x", x});
  dpt::testing::expect_param_gradients_match([&] { return ff.forward(x); }, wrt);
}

TEST(SwiGLU, GptBlocksUseTheFeedForwardTheConfigNames) {
  GPTConfig c;
  c.vocab_size = 11;
  c.block_size = 8;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_embd = 16;
  c.ffn = "swiglu";
  Generator gen(6);
  GPT gpt(c, gen);
  bool gate = false, fc = false;
  for (const auto& [name, p] : gpt.named_parameters()) {
    gate = gate || name == "blocks.1.mlp.gate.weight";
    fc = fc || name.find("mlp.fc") != std::string::npos;
  }
  EXPECT_TRUE(gate);
  EXPECT_FALSE(fc);
  Tensor idx = randint({2, 8}, 0, 11, gen, TensorOptions{}.with_dtype(DType::Int64));
  Tensor loss = gpt.loss(idx, idx);
  EXPECT_TRUE(std::isfinite(loss.item()));

  c.ffn = "swigl";
  try {
    GPT bad(c, gen);
    FAIL() << "an unknown feed-forward was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("known: mlp, swiglu"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace dpt::nn
