// The layers that run their activation inside dpt::linear (nn::MLP's Linear -> ReLU/GELU pairs, the
// transformer FeedForward's gelu(fc(x))): on the CPU they give exactly the numbers of the modules run
// one by one, with unchanged parameter names; on CUDA (skipped without a GPU) the fused and unfused
// paths (set_linear_fused) agree in float32 and bfloat16, outputs and every parameter gradient.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "core/cuda_runtime.h"
#include "core/factory.h"
#include "core/ops.h"
#include "layers/activation.h"
#include "layers/linear.h"
#include "layers/mlp.h"
#include "layers/transformer_block.h"

namespace dpt::nn {
namespace {

std::vector<std::string> names(const Module& m) {
  std::vector<std::string> out;
  for (const auto& [name, t] : m.named_parameters()) out.push_back(name);
  return out;
}

// Output and parameter gradients of sum(f(x) * w).
struct Outcome {
  std::vector<double> out;
  std::vector<std::vector<double>> grads;
};

Outcome run(Module& m, const Tensor& x, const std::function<Tensor(const Tensor&)>& f) {
  m.zero_grad(true);
  Tensor y = f(x);
  Generator g(3);
  Tensor w = rand(y.shape(), g, y.options(), 0.5, 1.5);
  sum(y * w).backward();
  Outcome r{y.to_vector<double>(), {}};
  for (const auto& [name, p] : m.named_parameters()) r.grads.push_back(p.grad().to_vector<double>());
  return r;
}

TEST(LinearFusionLayers, MlpOnCpuMatchesItsModulesRunOneByOne) {
  for (std::string act : {"relu", "gelu", "tanh"}) {
    SCOPED_TRACE(act);
    Generator gen(8);
    MLP mlp({6, 16, 12, 3}, act, gen);
    EXPECT_EQ(names(mlp), (std::vector<std::string>{"0.weight", "0.bias", "2.weight", "2.bias", "4.weight", "4.bias"}));
    Generator xg(9);
    Tensor x = randn({5, 6}, xg);
    Outcome fused = run(mlp, x, [&](const Tensor& v) { return mlp.forward(v); });
    Outcome separate = run(mlp, x, [&](const Tensor& v) {
      Tensor h = v;
      for (size_t i = 0; i < mlp.size(); ++i) h = mlp[i].forward(h);
      return h;
    });
    EXPECT_EQ(fused.out, separate.out);
    ASSERT_EQ(fused.grads.size(), separate.grads.size());
    for (size_t i = 0; i < fused.grads.size(); ++i) EXPECT_EQ(fused.grads[i], separate.grads[i]) << "parameter " << i;
  }
}

TEST(LinearFusionLayers, FeedForwardOnCpuIsProjOfGeluOfFc) {
  Generator gen(4);
  FeedForward ff(8, 0.0, gen);
  EXPECT_EQ(names(ff), (std::vector<std::string>{"fc.weight", "fc.bias", "proj.weight", "proj.bias"}));
  Generator xg(5);
  Tensor x = randn({2, 3, 8}, xg);
  Outcome fused = run(ff, x, [&](const Tensor& v) { return ff.forward(v); });
  Outcome separate = run(ff, x, [&](const Tensor& v) { return ff.proj->forward(gelu(ff.fc->forward(v))); });
  EXPECT_EQ(fused.out, separate.out);
  ASSERT_EQ(fused.grads.size(), separate.grads.size());
  for (size_t i = 0; i < fused.grads.size(); ++i) EXPECT_EQ(fused.grads[i], separate.grads[i]) << "parameter " << i;
}

double worst_relative(const std::vector<double>& got, const std::vector<double>& want) {
  double scale = 0, worst = 0;
  for (double v : want) scale = std::max(scale, std::abs(v));
  for (size_t i = 0; i < got.size() && i < want.size(); ++i) {
    const double e = std::abs(got[i] - want[i]) / (std::abs(want[i]) + 0.1 * scale + 1e-30);
    worst = std::isnan(e) ? INFINITY : std::max(worst, e);
  }
  return worst;
}

// Restores the fused switch however the test ends.
class FusedSwitch {
 public:
  explicit FusedSwitch(bool on) : before_(linear_fused()) { set_linear_fused(on); }
  ~FusedSwitch() { set_linear_fused(before_); }
  FusedSwitch(const FusedSwitch&) = delete;
  FusedSwitch& operator=(const FusedSwitch&) = delete;

 private:
  bool before_;
};

void expect_fused_matches_unfused(Module& m, const Tensor& x, double rtol, const std::string& what) {
  Outcome fused, unfused;
  {
    FusedSwitch on(true);
    fused = run(m, x, [&](const Tensor& v) { return m.forward(v); });
  }
  {
    FusedSwitch off(false);
    unfused = run(m, x, [&](const Tensor& v) { return m.forward(v); });
  }
  ASSERT_EQ(fused.out.size(), unfused.out.size()) << what;
  EXPECT_LE(worst_relative(fused.out, unfused.out), rtol) << what << " output";
  ASSERT_EQ(fused.grads.size(), unfused.grads.size()) << what;
  for (size_t i = 0; i < fused.grads.size(); ++i) {
    EXPECT_LE(worst_relative(fused.grads[i], unfused.grads[i]), rtol) << what << " parameter " << i;
  }
}

// Tolerances as tests/core/linear_op_test.cpp: float32 1e-5 (summation order), bfloat16 2e-2 (one
// rounding instead of three, cuBLASLt's GELU).
TEST(LinearFusionLayers, CudaMlpAndTransformerBlockFusedMatchUnfused) {
  if (!cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  for (DType dtype : {DType::Float32, DType::BFloat16}) {
    const double rtol = dtype == DType::BFloat16 ? 2e-2 : 1e-5;
    for (std::string act : {"relu", "gelu"}) {
      Generator gen(21);
      MLP mlp({64, 256, 256, 16}, act, gen);
      mlp.to(Device::cuda());
      mlp.to(dtype);
      Generator xg(22);
      Tensor x = randn({32, 64}, xg).to(dtype).to(Device::cuda());
      expect_fused_matches_unfused(mlp, x, rtol, "MLP " + act + " " + dtype_name(dtype));
    }
    Generator gen(23);
    TransformerBlock block(64, 4, 0.0, gen);
    block.to(Device::cuda());
    block.to(dtype);
    Generator xg(24);
    Tensor x = randn({2, 16, 64}, xg).to(dtype).to(Device::cuda());
    expect_fused_matches_unfused(block, x, rtol, std::string("TransformerBlock ") + dtype_name(dtype));
  }
}

}  // namespace
}  // namespace dpt::nn
