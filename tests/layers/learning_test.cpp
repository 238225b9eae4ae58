// Learning: the layers and optimizers together actually fit data, and deterministically.
#include <gtest/gtest.h>

#include <cmath>

#include "core/bfloat16.h"
#include "core/float16.h"
#include "core/factory.h"
#include "core/ops.h"
#include "layers/dropout.h"
#include "layers/gpt.h"
#include "layers/linear.h"
#include "layers/losses.h"
#include "layers/mlp.h"
#include "optim/adam.h"
#include "optim/mixed_precision.h"

namespace dpt::nn {
namespace {

const TensorOptions kI64 = TensorOptions{}.with_dtype(DType::Int64);

// Three interleaved spiral arms in the plane (a classic non-linearly-separable task).
void make_spirals(int64_t per_class, Tensor* x, Tensor* y, uint64_t seed) {
  const int64_t classes = 3, n = per_class * classes;
  Generator gen(seed);
  std::vector<float> noise = randn({n}, gen).to_vector<float>();
  std::vector<float> xs;
  std::vector<int64_t> ys;
  for (int64_t k = 0; k < classes; ++k) {
    for (int64_t i = 0; i < per_class; ++i) {
      double r = static_cast<double>(i) / static_cast<double>(per_class);
      double t = 4.0 * static_cast<double>(k) + 4.0 * r + 0.15 * noise[static_cast<size_t>(k * per_class + i)];
      xs.push_back(static_cast<float>(r * std::sin(t)));
      xs.push_back(static_cast<float>(r * std::cos(t)));
      ys.push_back(k);
    }
  }
  *x = from_vector(xs, {n, 2});
  *y = from_vector(ys, {n}, kI64);
}

double accuracy(const Tensor& logits, const Tensor& y) {
  auto pred = argmax(logits, 1).to_vector<int64_t>();
  auto truth = y.to_vector<int64_t>();
  int64_t right = 0;
  for (size_t i = 0; i < pred.size(); ++i) right += pred[i] == truth[i];
  return static_cast<double>(right) / static_cast<double>(pred.size());
}

TEST(Learning, MlpSolvesSpirals) {
  Tensor x, y;
  make_spirals(100, &x, &y, 3);
  Generator gen(0);
  MLP mlp({2, 64, 64, 3}, "relu", gen);
  optim::AdamOptions o;
  o.lr = 0.01;
  optim::Adam opt(mlp.named_parameters(), o);
  double first = 0, last = 0;
  for (int step = 0; step < 600; ++step) {
    opt.zero_grad();
    Tensor loss = cross_entropy_loss(mlp.forward(x), y);
    loss.backward();
    opt.step();
    if (step == 0) first = loss.item();
    last = loss.item();
  }
  EXPECT_LT(last, 0.3 * first);
  EXPECT_GE(accuracy(mlp.forward(x), y), 0.95);
  // Generalizes to fresh points of the same spirals.
  Tensor xt, yt;
  make_spirals(50, &xt, &yt, 11);
  EXPECT_GE(accuracy(mlp.forward(xt), yt), 0.9);
}

// The same task in float16 with float32 masters and dynamic loss scaling: the same accuracy bar. A
// short growth interval lets the scale grow (and back off on overflow) several times during the run.
TEST(Learning, MlpSolvesSpiralsInFp16WithLossScaling) {
  Tensor x, y;
  make_spirals(100, &x, &y, 3);
  Generator gen(0);
  MLP mlp({2, 64, 64, 3}, "relu", gen);
  optim::MixedPrecision mp(mlp.named_parameters(), DType::Float16, optim::LossScalerOptions{.growth_interval = 50});
  optim::AdamOptions o;
  o.lr = 0.01;
  optim::Adam opt(mp.master_params(), o);
  const Tensor x16 = x.to(DType::Float16);
  double first = 0, last = 0;
  int applied = 0;
  for (int step = 0; step < 600; ++step) {
    mlp.zero_grad();
    opt.zero_grad();
    Tensor loss = cross_entropy_loss(mlp.forward(x16), y);
    EXPECT_EQ(loss.dtype(), DType::Float32);
    mp.scale_loss(loss).backward();
    const bool finite = mp.grads_to_master();
    if (finite) {
      opt.step();
      mp.masters_to_model();
      ++applied;
    }
    mp.update_scale(!finite);
    if (step == 0) first = loss.item();
    last = loss.item();
  }
  EXPECT_EQ(opt.step_count(), applied);
  EXPECT_GE(applied, 550);  // a few skipped steps while the scale finds its level, not more
  EXPECT_LT(last, 0.3 * first);
  EXPECT_GE(accuracy(mlp.forward(x16), y), 0.95);
  Tensor xt, yt;
  make_spirals(50, &xt, &yt, 11);
  EXPECT_GE(accuracy(mlp.forward(xt.to(DType::Float16)), yt), 0.9);
}

GPTConfig tiny_config() {
  GPTConfig c;
  c.vocab_size = 16;
  c.block_size = 8;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_embd = 32;
  return c;
}

std::vector<double> train_gpt(uint64_t seed, int steps, DType compute, double dropout = 0.0) {
  GPTConfig cfg = tiny_config();
  cfg.dropout = dropout;
  Generator gen(seed);
  GPT gpt(cfg, gen);
  Generator data(123);
  Tensor tokens = randint({4, 9}, 0, cfg.vocab_size, data, kI64);
  Tensor idx = slice(tokens, 1, 0, 8).contiguous(), targets = slice(tokens, 1, 1, 9).contiguous();
  optim::MixedPrecision mp(gpt.named_parameters(), compute);
  optim::AdamOptions o;
  o.lr = 1e-2;
  optim::AdamW opt(optim::weight_decay_groups(mp.master_params(), 0.01), o);
  std::vector<double> losses;
  for (int step = 0; step < steps; ++step) {
    gpt.zero_grad();
    opt.zero_grad();
    Tensor loss = gpt.loss(idx, targets);
    mp.scale_loss(loss).backward();  // fp16: loss * loss scale; the identity otherwise
    const bool finite = mp.grads_to_master();
    if (finite) {
      opt.step();
      mp.masters_to_model();
    }
    mp.update_scale(!finite);
    losses.push_back(loss.item());
  }
  return losses;
}

TEST(Learning, TinyGptOverfitsOneBatch) {
  auto losses = train_gpt(1, 150, DType::Float32);
  EXPECT_NEAR(losses.front(), std::log(16.0), 0.3);  // starts near uniform
  EXPECT_LT(losses.back(), 0.1);
}

TEST(Learning, TinyGptOverfitsInBf16WithFloat32Masters) {
  auto losses = train_gpt(1, 150, DType::BFloat16);
  EXPECT_LT(losses.back(), 0.15);
}

TEST(Learning, TinyGptOverfitsInFp16WithFloat32MastersAndLossScaling) {
  auto losses = train_gpt(1, 150, DType::Float16);
  EXPECT_LT(losses.back(), 0.15);
}

TEST(Learning, SameSeedGivesIdenticalLossesIncludingDropout) {
  auto a = train_gpt(5, 8, DType::Float32, 0.1);
  auto b = train_gpt(5, 8, DType::Float32, 0.1);
  EXPECT_EQ(a, b);
  auto c = train_gpt(6, 8, DType::Float32, 0.1);
  EXPECT_NE(a, c);
}

TEST(Learning, MixedPrecisionKeepsFloat32MastersAndBf16Model) {
  Generator gen(2);
  GPT gpt(tiny_config(), gen);
  Tensor wte = gpt.wte->weight;
  optim::MixedPrecision mp(gpt.named_parameters(), DType::BFloat16);
  EXPECT_EQ(wte.dtype(), DType::BFloat16);
  EXPECT_EQ(mp.master_params()[0].second.dtype(), DType::Float32);
  EXPECT_TRUE(gpt.named_parameters()[0].second.same(wte));
  Tensor master = mp.master_params()[0].second;
  master.fill_(0.1234567);
  mp.masters_to_model();
  EXPECT_EQ(wte.to_vector<float>()[0], static_cast<float>(bf16(0.1234567f)));
}

}  // namespace
}  // namespace dpt::nn
