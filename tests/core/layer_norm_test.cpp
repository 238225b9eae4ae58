// Fused layer_norm: float64 finite-difference gradients, agreement with the composed definition,
// CPU-vs-CUDA parity (forward and all three gradients) in float32 and bfloat16, and the parameters' first
// gradients written straight into their buffers.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/cuda_runtime.h"
#include "core/error.h"
#include "core/factory.h"
#include "core/ops.h"
#include "core/ops_norm.h"
#include "gradcheck.h"
#include "max_relative.h"

using namespace dpt;

namespace {

Tensor composed_layer_norm(const Tensor& x, const Tensor& w, const Tensor& b, double eps) {
  Tensor centered = x - mean(x, -1, true);
  Tensor var = mean(centered * centered, -1, true);
  return centered * pow(var + eps, -0.5) * w + b;
}


}  // namespace

TEST(LayerNormOp, GradientsMatchFiniteDifferencesInFloat64) {
  Generator gen(7);
  TensorOptions f64 = TensorOptions{}.with_dtype(DType::Float64);
  Tensor x = randn({3, 2, 5}, gen, f64);
  Tensor w = randn({5}, gen, f64);
  Tensor b = randn({5}, gen, f64);
  expect_gradients_match([](const std::vector<Tensor>& in) { return layer_norm(in[0], in[1], in[2], 1e-5); },
                         {x, w, b}, 1e-6);
}

TEST(LayerNormOp, MatchesTheComposedDefinitionForwardAndBackward) {
  Generator gen(8);
  TensorOptions f64 = TensorOptions{}.with_dtype(DType::Float64).with_requires_grad(true);
  Tensor x = randn({6, 33}, gen, f64), w = randn({33}, gen, f64), b = randn({33}, gen, f64);
  Tensor x2 = x.detach().clone().requires_grad_(), w2 = w.detach().clone().requires_grad_(),
         b2 = b.detach().clone().requires_grad_();
  Tensor g = randn({6, 33}, gen, TensorOptions{}.with_dtype(DType::Float64));
  Tensor fused = layer_norm(x, w, b, 1e-5);
  Tensor reference = composed_layer_norm(x2, w2, b2, 1e-5);
  EXPECT_LT(max_relative(fused, reference), 1e-12);
  fused.backward(g);
  reference.backward(g);
  EXPECT_LT(max_relative(x.grad(), x2.grad()), 1e-10);
  EXPECT_LT(max_relative(w.grad(), w2.grad()), 1e-10);
  EXPECT_LT(max_relative(b.grad(), b2.grad()), 1e-10);
}

TEST(LayerNormOp, RowsHaveMeanZeroAndVarianceOne) {
  Generator gen(9);
  Tensor x = randn({4, 64}, gen, TensorOptions{}, 3.0, 5.0);
  Tensor y = layer_norm(x, ones({64}), zeros({64}), 1e-5);
  auto m = mean(y, -1).to_vector<double>();
  auto v = mean(y * y, -1).to_vector<double>();
  for (size_t r = 0; r < m.size(); ++r) {
    EXPECT_NEAR(m[r], 0.0, 1e-5);
    EXPECT_NEAR(v[r], 1.0, 1e-3);
  }
}

TEST(LayerNormOp, ShapeMismatchNamesBothShapes) {
  try {
    layer_norm(zeros({2, 4}), ones({3}), zeros({3}));
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("[2, 4]"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("[3]"), std::string::npos) << e.what();
  }
}

TEST(CudaLayerNorm, MatchesCpuForwardAndBackwardInFloat32Bfloat16AndFloat16) {
  if (!cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  // Rows of 768 (GPT-2) and an odd width; 70 rows span several backward chunks and a partial one.
  for (int64_t n : {768, 37}) {
    for (DType dtype : {DType::Float32, DType::BFloat16, DType::Float16}) {
      Generator gen(11 + n);
      TensorOptions opts = TensorOptions{}.with_dtype(dtype);
      Tensor x = randn({70, n}, gen, opts), w = randn({n}, gen, opts), b = randn({n}, gen, opts);
      Tensor g = randn({70, n}, gen, opts);
      auto run = [&](Device d) {
        Tensor xd = x.to(d).detach().requires_grad_(), wd = w.to(d).detach().requires_grad_(),
               bd = b.to(d).detach().requires_grad_();
        Tensor y = layer_norm(xd, wd, bd, 1e-5);
        y.backward(g.to(d));
        return std::vector<Tensor>{y.to(Device::cpu()), xd.grad().to(Device::cpu()), wd.grad().to(Device::cpu()),
                                   bd.grad().to(Device::cpu())};
      };
      auto cpu = run(Device::cpu());
      auto gpu = run(Device::cuda(0));
      double tol = dtype == DType::Float32 ? 1e-5 : 1e-2;
      const char* names[] = {"y", "grad x", "grad weight", "grad bias"};
      for (size_t i = 0; i < cpu.size(); ++i) {
        EXPECT_LT(max_relative(gpu[i], cpu[i]), tol) << names[i] << " n=" << n << " " << dtype_name(dtype);
      }
    }
  }
}

namespace {

// The weight's and bias's first gradients since zero_grad() go from the backward kernel straight into their
// buffers (views of one bucket, core/autograd.h grad_out_for): bit for bit what they are through autograd
// (after zero_grad(set_to_none)), the neighbours untouched, each hook fired once. w has a second use whose
// backward runs after the norm's (created first), so when x's gradient is final w's buffer already holds
// the norm's part and w's hook has not fired. A second backward without zero_grad accumulates.
void check_parameter_gradients_written_into_buffers(Device device, DType dtype) {
  SCOPED_TRACE(device.str() + " " + dtype_name(dtype));
  Generator gen(5);
  const TensorOptions opts = TensorOptions{}.with_dtype(dtype);
  const int64_t n = 96;
  auto on = [&](const Tensor& t) { return t.to(device).detach().requires_grad_(); };
  Tensor x = on(randn({40, n}, gen, opts)), w = on(randn({n}, gen, opts)), b = on(randn({n}, gen, opts));
  const Tensor c = randn({40, n}, gen, opts).to(device), c2 = randn({n}, gen, opts).to(device);
  auto forward_backward = [&] {
    Tensor other = mul(w, c2);  // created first: its backward runs last
    add(sum(mul(layer_norm(x, w, b, 1e-5), c)), sum(other)).backward();
  };
  auto grads = [&] {
    std::vector<std::vector<double>> g;
    for (Tensor* p : {&x, &w, &b}) g.push_back(p->grad().to(Device::cpu()).to_vector<double>());
    return g;
  };
  forward_backward();
  const auto want = grads();
  forward_backward();
  const auto want_twice = grads();

  Tensor bucket = full({2 * n + 6}, 7.0, opts.with_device(device));
  Tensor wv = make_view(bucket, {n}, {1}, 3), bv = make_view(bucket, {n}, {1}, n + 5);
  w.set_grad(wv);
  b.set_grad(bv);
  int w_hooks = 0;
  bool first = true, written_early = false;
  w.register_grad_ready_hook([&](const Tensor&) { ++w_hooks; });
  x.register_grad_ready_hook([&](const Tensor&) {
    if (!first) return;
    const std::vector<double> v = wv.to(Device::cpu()).to_vector<double>();
    written_early = w_hooks == 0 && std::any_of(v.begin(), v.end(), [](double e) { return e != 7.0; });
  });
  for (Tensor* p : {&x, &w, &b}) p->zero_grad();
  forward_backward();
  first = false;
  EXPECT_TRUE(written_early) << "w's first gradient went through autograd, not into its buffer";
  EXPECT_EQ(grads(), want);
  EXPECT_EQ(w.grad().data_ptr(), wv.data_ptr());
  EXPECT_EQ(b.grad().data_ptr(), bv.data_ptr());
  EXPECT_EQ(w_hooks, 1);
  forward_backward();
  EXPECT_EQ(grads(), want_twice);
  EXPECT_EQ(w_hooks, 2);
  const std::vector<double> all = bucket.to(Device::cpu()).to_vector<double>();
  for (int64_t i : {int64_t{0}, int64_t{2}, n + 3, n + 4, 2 * n + 5}) EXPECT_EQ(all[static_cast<size_t>(i)], 7.0) << i;
}

TEST(LayerNormOp, ParameterGradientsAreWrittenIntoTheirBuffers) {
  check_parameter_gradients_written_into_buffers(Device::cpu(), DType::Float64);
}

TEST(CudaLayerNorm, ParameterGradientsAreWrittenIntoTheirBuffers) {
  if (!cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  for (DType dtype : {DType::Float32, DType::BFloat16}) {
    check_parameter_gradients_written_into_buffers(Device::cuda(0), dtype);
  }
}

}  // namespace
