// Fused causal softmax: float64 finite differences, agreement with the unfused reference
// softmax(scale * s + mask), and CPU-vs-CUDA parity in float32 and bfloat16.
#include <gtest/gtest.h>

#include <cmath>

#include "core/cuda_runtime.h"
#include "core/factory.h"
#include "core/ops.h"
#include "core/ops_attention.h"
#include "gradcheck.h"
#include "max_relative.h"

using namespace dpt;

namespace {

// The naive path the fused op replaces: scale, add a -inf-like mask above the diagonal, softmax.
Tensor reference_causal_softmax(const Tensor& s, double scale) {
  int64_t t = s.size(-1);
  std::vector<double> mask(static_cast<size_t>(t * t), 0.0);
  for (int64_t i = 0; i < t; ++i)
    for (int64_t j = i + 1; j < t; ++j) mask[static_cast<size_t>(i * t + j)] = -1e30;
  return softmax(s * scale + from_vector(mask, {t, t}, s.options()));
}


}  // namespace

TEST(CausalSoftmax, GradientsMatchFiniteDifferencesInFloat64) {
  Generator gen(3);
  Tensor s = randn({2, 3, 5, 5}, gen, TensorOptions{}.with_dtype(DType::Float64));
  expect_gradients_match([](const std::vector<Tensor>& in) { return causal_softmax(in[0], 0.7); }, {s}, 1e-6);
}

TEST(CausalSoftmax, EqualsScaledMaskedSoftmaxForwardAndBackward) {
  Generator gen(4);
  TensorOptions f64 = TensorOptions{}.with_dtype(DType::Float64);
  Tensor s1 = randn({2, 7, 7}, gen, f64).requires_grad_(), s2 = s1.detach().clone().requires_grad_();
  Tensor g = randn({2, 7, 7}, gen, f64);
  Tensor fused = causal_softmax(s1, 0.3), ref = reference_causal_softmax(s2, 0.3);
  EXPECT_LT(max_relative(fused, ref), 1e-12);
  fused.backward(g);
  ref.backward(g);
  EXPECT_LT(max_relative(s1.grad(), s2.grad()), 1e-12);
}

TEST(CausalSoftmax, RowsSumToOneAndTheFutureIsZero) {
  Generator gen(5);
  Tensor y = causal_softmax(randn({4, 9, 9}, gen), 1.0);
  auto v = y.to_vector<double>();
  for (int64_t r = 0; r < 4 * 9; ++r) {
    double sum = 0;
    for (int64_t j = 0; j < 9; ++j) {
      double p = v[static_cast<size_t>(r * 9 + j)];
      if (j > r % 9) {
        EXPECT_EQ(p, 0.0);
      }
      sum += p;
    }
    EXPECT_NEAR(sum, 1.0, 1e-6);
  }
}

TEST(CudaCausalSoftmax, MatchesCpuInFloat32AndBfloat16) {
  if (!cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  for (int64_t t : {1, 33, 256}) {
    for (DType dtype : {DType::Float32, DType::BFloat16}) {
      Generator gen(20 + t);
      TensorOptions opts = TensorOptions{}.with_dtype(dtype);
      Tensor s = randn({2, 3, t, t}, gen, opts), g = randn({2, 3, t, t}, gen, opts);
      auto run = [&](Device d) {
        Tensor sd = s.to(d).detach().requires_grad_();
        Tensor y = causal_softmax(sd, 0.125);
        y.backward(g.to(d));
        return std::make_pair(y.to(Device::cpu()), sd.grad().to(Device::cpu()));
      };
      auto [y_cpu, g_cpu] = run(Device::cpu());
      auto [y_gpu, g_gpu] = run(Device::cuda(0));
      double tol = dtype == DType::Float32 ? 1e-5 : 1e-2;
      EXPECT_LT(max_relative(y_gpu, y_cpu), tol) << "forward t=" << t << " " << dtype_name(dtype);
      EXPECT_LT(max_relative(g_gpu, g_cpu), tol) << "backward t=" << t << " " << dtype_name(dtype);
    }
  }
}
