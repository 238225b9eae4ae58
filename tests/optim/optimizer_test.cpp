// Optimizers against closed forms, groups, state round trips and gradient clipping.
#include <gtest/gtest.h>

#include <cmath>

#include "core/error.h"
#include "core/factory.h"
#include "core/ops.h"
#include "optim/adam.h"
#include "optim/grad_clip.h"
#include "optim/sgd.h"

namespace dpt::optim {
namespace {

const TensorOptions kF64 = TensorOptions{}.with_dtype(DType::Float64);

Tensor param(const std::vector<double>& v) {
  Tensor t = from_vector(v, {static_cast<int64_t>(v.size())}, kF64);
  t.requires_grad_(true);
  return t;
}

// f(w) = sum(a * w^2) / 2, so grad = a * w.
Tensor quadratic(const Tensor& w, const Tensor& a) { return sum(a * w * w) * 0.5; }

TEST(Optimizers, SgdOnAQuadraticMatchesTheClosedForm) {
  // w_t = w_0 (1 - lr a)^t
  Tensor w = param({1.0, -2.0, 0.5});
  Tensor a = from_vector<double>({1.0, 0.5, 3.0}, {3}, kF64);
  SgdOptions o;
  o.lr = 0.1;
  SGD sgd({{"w", w}}, o);
  for (int t = 0; t < 20; ++t) {
    sgd.zero_grad();
    quadratic(w, a).backward();
    sgd.step();
  }
  auto got = w.to_vector<double>();
  std::vector<double> w0 = {1.0, -2.0, 0.5}, av = {1.0, 0.5, 3.0};
  for (int i = 0; i < 3; ++i) EXPECT_NEAR(got[i], w0[i] * std::pow(1 - 0.1 * av[i], 20), 1e-12) << i;
  EXPECT_EQ(sgd.step_count(), 20);
}

TEST(Optimizers, SgdMomentumNesterovAndWeightDecayFollowTheRecurrence) {
  for (bool nesterov : {false, true}) {
    Tensor w = param({1.5});
    Tensor a = from_vector<double>({2.0}, {1}, kF64);
    SgdOptions o;
    o.lr = 0.05;
    o.momentum = 0.9;
    o.nesterov = nesterov;
    o.weight_decay = 0.1;
    SGD sgd({{"w", w}}, o);
    double ref = 1.5, buf = 0;
    for (int t = 0; t < 10; ++t) {
      sgd.zero_grad();
      quadratic(w, a).backward();
      sgd.step();
      double g = 2.0 * ref + 0.1 * ref;
      buf = 0.9 * buf + g;
      ref -= 0.05 * (nesterov ? g + 0.9 * buf : buf);
    }
    EXPECT_NEAR(w.item(), ref, 1e-12) << nesterov;
  }
  EXPECT_THROW(SGD({{"w", param({1.0})}}, SgdOptions{0.1, 0.0, true, 0.0}), Error);
}

TEST(Optimizers, AdamOnAConstantGradientMovesLrPerStep) {
  // With g constant, m_hat = g and v_hat = g^2 exactly, so every step is lr * g / (|g| + eps).
  Tensor w = param({0.0, 0.0});
  Tensor c = from_vector<double>({3.0, -0.5}, {2}, kF64);
  AdamOptions o;
  o.lr = 0.01;
  Adam adam({{"w", w}}, o);
  for (int t = 0; t < 7; ++t) {
    adam.zero_grad();
    sum(c * w).backward();
    adam.step();
  }
  auto got = w.to_vector<double>();
  EXPECT_NEAR(got[0], -7 * 0.01 * 3.0 / (3.0 + 1e-8), 1e-12);
  EXPECT_NEAR(got[1], 7 * 0.01 * 0.5 / (0.5 + 1e-8), 1e-12);
}

TEST(Optimizers, AdamOnAQuadraticMatchesTheScalarRecurrence) {
  for (bool decoupled : {false, true}) {
    Tensor w = param({2.0});
    Tensor a = from_vector<double>({0.7}, {1}, kF64);
    AdamOptions o;
    o.lr = 0.1;
    o.beta1 = 0.8;
    o.beta2 = 0.95;
    o.weight_decay = 0.2;
    std::unique_ptr<Optimizer> opt;
    if (decoupled) {
      opt = std::make_unique<AdamW>(NamedTensors{{"w", w}}, o);
    } else {
      opt = std::make_unique<Adam>(NamedTensors{{"w", w}}, o);
    }
    double ref = 2.0, m = 0, v = 0;
    for (int t = 1; t <= 15; ++t) {
      opt->zero_grad();
      quadratic(w, a).backward();
      opt->step();
      double g = 0.7 * ref;
      if (decoupled) {
        ref *= 1 - 0.1 * 0.2;
      } else {
        g += 0.2 * ref;
      }
      m = 0.8 * m + 0.2 * g;
      v = 0.95 * v + 0.05 * g * g;
      ref -= 0.1 * (m / (1 - std::pow(0.8, t))) / (std::sqrt(v / (1 - std::pow(0.95, t))) + 1e-8);
    }
    EXPECT_NEAR(w.item(), ref, 1e-12) << decoupled;
  }
}

TEST(Optimizers, WeightDecayGroupsSkipBiasesAndNorms) {
  NamedTensors params = {{"fc.weight", param({1, 2, 3, 4}).reshape({2, 2}).detach()},
                         {"fc.bias", param({1, 2})},
                         {"ln.weight", param({1, 1})}};
  params[0].second.requires_grad_(true);
  auto groups = weight_decay_groups(params, 0.1);
  ASSERT_EQ(groups.size(), 2u);
  EXPECT_EQ(groups[0].weight_decay, 0.1);
  ASSERT_EQ(groups[0].params.size(), 1u);
  EXPECT_EQ(groups[0].params[0].first, "fc.weight");
  EXPECT_EQ(groups[1].weight_decay, 0.0);
  EXPECT_EQ(groups[1].params.size(), 2u);
  // With zero gradients, AdamW only decays the first group.
  AdamOptions o;
  o.lr = 0.5;
  AdamW opt(groups, o);
  for (auto& [n, p] : params) p.set_grad(zeros_like(p.detach()));
  opt.step();
  std::vector<double> decayed = params[0].second.to_vector<double>(), expected = {0.95, 1.9, 2.85, 3.8};
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(decayed[i], expected[i], 1e-15);
  EXPECT_EQ(params[1].second.to_vector<double>(), (std::vector<double>{1, 2}));
}

TEST(Optimizers, ParametersWithoutGradientsAreLeftAlone) {
  Tensor w = param({1.0}), u = param({2.0});
  SGD sgd({{"w", w}, {"u", u}}, SgdOptions{});
  sum(w * 3.0).backward();
  sgd.step();
  EXPECT_NEAR(w.item(), 1.0 - 0.01 * 3.0, 1e-15);
  EXPECT_EQ(u.item(), 2.0);
}

TEST(Optimizers, StateDictRoundTripResumesIdentically) {
  auto run = [](Adam& opt, Tensor& w, int steps) {
    Tensor a = from_vector<double>({1.0, 2.0}, {2}, kF64);
    for (int t = 0; t < steps; ++t) {
      opt.zero_grad();
      quadratic(w, a).backward();
      opt.step();
    }
  };
  Tensor w1 = param({1.0, -1.0});
  Adam a1({{"w", w1}}, AdamOptions{});
  run(a1, w1, 10);

  Tensor w2 = param({1.0, -1.0});
  Adam a2({{"w", w2}}, AdamOptions{});
  run(a2, w2, 4);
  NamedTensors state = a2.state_dict();
  EXPECT_EQ(state.size(), 3u);
  EXPECT_EQ(state[1].first, "exp_avg.w");
  Tensor w3 = param(w2.to_vector<double>());
  Adam a3({{"w", w3}}, AdamOptions{});
  a3.load_state_dict(state);
  EXPECT_EQ(a3.step_count(), 4);
  run(a3, w3, 6);
  EXPECT_EQ(w3.to_vector<double>(), w1.to_vector<double>());

  NamedTensors bad = state;
  bad[2].second = zeros({3}, kF64);
  EXPECT_THROW(a3.load_state_dict(bad), Error);
  bad.pop_back();
  EXPECT_THROW(a3.load_state_dict(bad), Error);
}

TEST(GradClip, ReturnsTheGlobalNormAndScalesOnlyAboveTheLimit) {
  Tensor w = param({0, 0}), u = param({0});
  w.set_grad(from_vector<double>({3, 0}, {2}, kF64));
  u.set_grad(from_vector<double>({4}, {1}, kF64));
  EXPECT_NEAR(clip_grad_norm({w, u}, 10.0), 5.0, 1e-15);
  EXPECT_EQ(w.grad().to_vector<double>(), (std::vector<double>{3, 0}));
  EXPECT_NEAR(clip_grad_norm({w, u}, 1.0), 5.0, 1e-15);
  EXPECT_NEAR(w.grad().to_vector<double>()[0], 3.0 / (5.0 + 1e-6), 1e-12);
  EXPECT_NEAR(u.grad().item(), 4.0 / (5.0 + 1e-6), 1e-12);
  EXPECT_NEAR(grad_norm({w, u}), 1.0, 1e-6);
  Tensor f = zeros({1});
  f.requires_grad_(true);
  f.set_grad(from_vector<float>({2.0f}, {1}));
  EXPECT_NEAR(clip_grad_norm(NamedTensors{{"f", f}}, 1.0), 2.0, 1e-6);
}

}  // namespace
}  // namespace dpt::optim
