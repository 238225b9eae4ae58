// dpt::layer_norm_and_skip (core/ops_norm.h): {layer_norm(x), x}, with the skip connection's gradient added
// inside the LayerNorm backward kernel. Pinned here: float64 finite differences through both outputs; the
// same gradients as the composition (layer_norm(x) and x used directly) on the CPU and on CUDA, for row
// widths the warp kernels take (256 to 2,048 features: column sums in registers, and in shared memory at two
// blocks an SM and at one) and rows they leave to the block kernel (an odd width); and one output alone
// still gets its gradient.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "core/cuda_runtime.h"
#include "core/factory.h"
#include "core/ops.h"
#include "core/ops_norm.h"
#include "gradcheck.h"

namespace dpt {
namespace {

const TensorOptions kF64 = TensorOptions{}.with_dtype(DType::Float64);

// h = skip + normed * u with a fixed u: both outputs reach the loss, as in x + f(layer_norm(x)).
Tensor block_like(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& u, bool fused) {
  if (fused) {
    const NormAndSkip s = layer_norm_and_skip(x, w, b);
    return add(s.skip, mul(s.normed, u));
  }
  return add(x, mul(layer_norm(x, w, b), u));
}

struct Grads {
  std::vector<double> x, w, b;
};

Grads grads_of(const Tensor& x0, const Tensor& w0, const Tensor& b0, const Tensor& u, const Tensor& v, bool fused) {
  Tensor x = x0.detach().clone(), w = w0.detach().clone(), b = b0.detach().clone();
  for (Tensor* t : {&x, &w, &b}) t->requires_grad_(true);
  sum(mul(block_like(x, w, b, u, fused), v)).backward();
  auto host = [](const Tensor& g) { return g.to(Device::cpu()).to(DType::Float64).to_vector<double>(); };
  return {host(x.grad()), host(w.grad()), host(b.grad())};
}

double worst_relative(const std::vector<double>& got, const std::vector<double>& want) {
  double scale = 0, worst = 0;
  for (double v : want) scale = std::max(scale, std::abs(v));
  for (size_t i = 0; i < got.size(); ++i) worst = std::max(worst, std::abs(got[i] - want[i]) / (scale + 1e-30));
  return got.size() == want.size() ? worst : INFINITY;
}

TEST(LayerNormAndSkip, GradientsMatchFiniteDifferencesThroughBothOutputs) {
  Generator gen(3);
  Tensor u = randn({5}, gen, kF64);
  expect_gradients_match(
      [&](const std::vector<Tensor>& in) { return block_like(in[0], in[1], in[2], u, true); },
      {randn({2, 3, 5}, gen, kF64), randn({5}, gen, kF64), randn({5}, gen, kF64)}, 1e-6);
}

TEST(LayerNormAndSkip, SameGradientsAsTheCompositionAndTheSkipValuesAreX) {
  Generator gen(4);
  Tensor x = randn({6, 7}, gen, kF64), w = randn({7}, gen, kF64), b = randn({7}, gen, kF64);
  Tensor u = randn({7}, gen, kF64), v = randn({6, 7}, gen, kF64);
  const NormAndSkip s = layer_norm_and_skip(x, w, b);
  EXPECT_EQ(s.skip.to_vector<double>(), x.to_vector<double>());
  EXPECT_EQ(s.normed.to_vector<double>(), layer_norm(x, w, b).to_vector<double>());
  const Grads fused = grads_of(x, w, b, u, v, true), composed = grads_of(x, w, b, u, v, false);
  EXPECT_LE(worst_relative(fused.x, composed.x), 1e-14);
  EXPECT_EQ(fused.w, composed.w);
  EXPECT_EQ(fused.b, composed.b);
}

TEST(LayerNormAndSkip, EitherOutputAloneGetsItsGradient) {
  Generator gen(5);
  Tensor x0 = randn({4, 6}, gen, kF64), w = randn({6}, gen, kF64), b = randn({6}, gen, kF64);
  Tensor x = x0.clone();
  x.requires_grad_(true);
  sum(mul(layer_norm_and_skip(x, w, b).skip, 3.0)).backward();
  for (double g : x.grad().to_vector<double>()) EXPECT_EQ(g, 3.0);
  Tensor y = x0.clone();
  y.requires_grad_(true);
  sum(mul(layer_norm_and_skip(y, w, b).normed, randn({4, 6}, gen, kF64))).backward();
  EXPECT_GT(sum(mul(y.grad(), y.grad())).item(), 1e-6);
}

TEST(CudaLayerNormAndSkip, MatchesTheCompositionOnTheWarpAndBlockKernels) {
  if (!cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  for (int64_t n : {256, 512, 768, 1024, 1536, 2048, 37}) {
    for (DType dtype : {DType::Float32, DType::BFloat16}) {
      SCOPED_TRACE(std::to_string(n) + " columns, " + dtype_name(dtype));
      Generator gen(6);
      const TensorOptions gpu = TensorOptions{}.with_dtype(dtype).with_device(Device::cuda(0));
      Tensor x = randn({64, n}, gen, gpu), w = randn({n}, gen, gpu), b = randn({n}, gen, gpu);
      Tensor u = randn({n}, gen, gpu), v = randn({64, n}, gen, gpu);
      const Grads fused = grads_of(x, w, b, u, v, true), composed = grads_of(x, w, b, u, v, false);
      // bfloat16: the composition rounds the LayerNorm gradient and then the sum, the fused kernel once.
      const double tol = dtype == DType::Float32 ? 1e-6 : 8e-3;
      EXPECT_LE(worst_relative(fused.x, composed.x), tol);
      EXPECT_EQ(fused.w, composed.w);
      EXPECT_EQ(fused.b, composed.b);
      // And against float64 on the CPU, from the same rounded inputs.
      auto cpu = [](const Tensor& t) { return t.to(Device::cpu()).to(DType::Float64); };
      const Grads truth = grads_of(cpu(x), cpu(w), cpu(b), cpu(u), cpu(v), true);
      EXPECT_LE(worst_relative(fused.x, truth.x), dtype == DType::Float32 ? 1e-5 : 2e-2);
    }
  }
}

}  // namespace
}  // namespace dpt
