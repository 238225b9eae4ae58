// sign, abs, where and lerp: known answers in float32 and bfloat16, gradients against finite
// differences, and the same numbers on CUDA as on the CPU (skipped without a GPU).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "core/cuda_runtime.h"
#include "core/factory.h"
#include "core/ops.h"
#include "tests/core/gradcheck.h"

namespace dpt {
namespace {

const TensorOptions kF64 = TensorOptions{}.with_dtype(DType::Float64);

Tensor vec(const std::vector<float>& v, DType dtype = DType::Float32) {
  return from_vector<float>(v, {static_cast<int64_t>(v.size())}).to(dtype);
}

TEST(SignAbs, KnownAnswersInFloat32AndBFloat16) {
  for (DType dtype : {DType::Float32, DType::BFloat16}) {
    SCOPED_TRACE(dtype_name(dtype));
    Tensor x = vec({-2.5f, -0.0f, 0.0f, 3.0f, 1e-30f}, dtype);
    Tensor s = sign(x);
    EXPECT_EQ(s.dtype(), dtype);
    EXPECT_EQ(s.to_vector<float>(), (std::vector<float>{-1, 0, 0, 1, 1}));
    std::vector<float> m = abs(x).to_vector<float>();
    EXPECT_EQ(std::vector<float>(m.begin(), m.begin() + 4), (std::vector<float>{2.5f, 0, 0, 3}));
    EXPECT_EQ(m[4], x.to_vector<float>()[4]);
  }
}

TEST(SignAbs, SignOfNaNIsNaN) {
  Tensor x = vec({std::numeric_limits<float>::quiet_NaN()});
  EXPECT_TRUE(std::isnan(sign(x).to_vector<float>()[0]));
}

TEST(SignAbs, SignHasZeroGradientAndAbsHasSignTimesGradient) {
  Tensor x = vec({-2, 0, 3});
  x.requires_grad_(true);
  sum(mul(sign(x), 5.0)).backward();
  EXPECT_EQ(x.grad().to_vector<float>(), (std::vector<float>{0, 0, 0}));

  Tensor y = vec({-2, 0, 3});
  y.requires_grad_(true);
  sum(mul(abs(y), vec({1, 2, 3}))).backward();
  EXPECT_EQ(y.grad().to_vector<float>(), (std::vector<float>{-1, 0, 3}));
}

TEST(SignAbs, AbsGradientMatchesFiniteDifferencesAwayFromZero) {
  Tensor x = from_vector<double>({-1.5, -0.25, 0.4, 2.0, -3.0, 0.7}, {2, 3}, kF64);
  expect_gradients_match([](const std::vector<Tensor>& t) { return abs(t[0]); }, {x});
  expect_gradients_match([](const std::vector<Tensor>& t) { return mul(sign(t[0]), t[0]); }, {x});
}

TEST(Where, SelectsByConditionWithBroadcasting) {
  for (DType dtype : {DType::Float32, DType::BFloat16}) {
    SCOPED_TRACE(dtype_name(dtype));
    Tensor cond = from_vector<float>({1, 0, 1}, {3}).to(dtype);
    Tensor a = from_vector<float>({1, 2, 3, 4, 5, 6}, {2, 3}).to(dtype);
    Tensor b = scalar_tensor(-1).to(dtype);
    Tensor out = where(cond, a, b);
    EXPECT_EQ(out.shape(), (Shape{2, 3}));
    EXPECT_EQ(out.to_vector<float>(), (std::vector<float>{1, -1, 3, 4, -1, 6}));
  }
}

TEST(Where, ConditionOfAnotherDtypeTestsForNonzero) {
  Tensor a = vec({1, 2, 3, 4});
  Tensor b = vec({-1, -2, -3, -4});
  Tensor mask = from_vector<int64_t>({0, 7, 0, -1}, {4}, TensorOptions{}.with_dtype(DType::Int64));
  EXPECT_EQ(where(mask, a, b).to_vector<float>(), (std::vector<float>{-1, 2, -3, 4}));
  // A float64 value too small for float32 still counts as nonzero.
  Tensor tiny = from_vector<double>({1e-300, 0, -1e-300, 0}, {4}, kF64);
  EXPECT_EQ(where(tiny, a, b).to_vector<float>(), (std::vector<float>{1, -2, 3, -4}));
}

TEST(Where, GradientGoesToTheSelectedOperand) {
  Tensor cond = from_vector<double>({1, 0, 0, 1, 1, 0}, {2, 3}, kF64);
  Tensor a = from_vector<double>({0.5, -1, 2, 3, -4, 1.5}, {2, 3}, kF64);
  Tensor b = from_vector<double>({7, 8, 9}, {3}, kF64);  // broadcast over rows: its gradient sums them
  expect_gradients_match([&](const std::vector<Tensor>& t) { return where(cond, t[0], t[1]); }, {a, b});

  Tensor la = a.detach().clone(), lb = b.detach().clone();
  la.requires_grad_(true);
  lb.requires_grad_(true);
  sum(where(cond, la, lb)).backward();
  EXPECT_EQ(la.grad().to_vector<double>(), cond.to_vector<double>());
  EXPECT_EQ(lb.grad().to_vector<double>(), (std::vector<double>{0, 1, 2}));
}

TEST(Where, MismatchedValuesAreRefusedNamingTheOp) {
  Tensor a = vec({1, 2});
  Tensor b = vec({1, 2}, DType::BFloat16);
  try {
    where(vec({1, 0}), a, b);
    FAIL() << "expected an error";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("where"), std::string::npos) << e.what();
  }
}

TEST(Lerp, KnownAnswersWithScalarAndTensorWeights) {
  for (DType dtype : {DType::Float32, DType::BFloat16}) {
    SCOPED_TRACE(dtype_name(dtype));
    Tensor a = vec({0, 2, -4}, dtype), b = vec({10, 4, 4}, dtype);
    EXPECT_EQ(lerp(a, b, 0.25).to_vector<float>(), (std::vector<float>{2.5f, 2.5f, -2}));
    EXPECT_EQ(lerp(a, b, 0.75).to_vector<float>(), (std::vector<float>{7.5f, 3.5f, 2}));
    EXPECT_EQ(lerp(a, b, 0.0).to_vector<float>(), a.to_vector<float>());
    EXPECT_EQ(lerp(a, b, 1.0).to_vector<float>(), b.to_vector<float>());
    EXPECT_EQ(lerp(a, b, vec({0, 0.5f, 1}, dtype)).to_vector<float>(), (std::vector<float>{0, 3, 4}));
  }
}

TEST(Lerp, WeightOneGivesTheEndExactlyWhereTheNaiveFormRoundsAway) {
  // a + 1 * (b - a) loses b here in float32 (b - a rounds); the b-side form does not.
  Tensor a = vec({1e8f}), b = vec({3.0f});
  EXPECT_EQ(lerp(a, b, 1.0).to_vector<float>()[0], 3.0f);
}

TEST(Lerp, GradientsToStartEndAndWeight) {
  Generator gen(5);
  Tensor a = randn({2, 3}, gen, kF64), b = randn({2, 3}, gen, kF64), w = rand({3}, gen, kF64);
  for (double weight : {0.1, 0.9}) {
    expect_gradients_match([weight](const std::vector<Tensor>& t) { return lerp(t[0], t[1], weight); }, {a, b});
  }
  expect_gradients_match([](const std::vector<Tensor>& t) { return lerp(t[0], t[1], t[2]); }, {a, b, w});
}

// --- CUDA parity --------------------------------------------------------------------------------

std::vector<double> run(const Tensor& x_cpu, Device device, DType dtype, const std::function<Tensor(const Tensor&)>& f,
                        std::vector<double>* grad) {
  Tensor x = x_cpu.to(dtype).to(device).detach().clone();
  x.requires_grad_(true);
  Tensor out = f(x);
  sum(mul(out, 1.5)).backward();
  *grad = x.grad().to_vector<double>();
  return out.to_vector<double>();
}

TEST(SignAbsWhereLerpCuda, MatchTheCpu) {
  if (!cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  Generator gen(9);
  Tensor x = randn({1003}, gen);  // 16-byte vectors plus a tail
  Tensor other = randn({1003}, gen);
  Tensor mask = randint({1003}, 0, 2, gen, TensorOptions{}.with_dtype(DType::Int64));
  Tensor w = rand({1003}, gen);
  const std::vector<std::pair<const char*, std::function<Tensor(const Tensor&)>>> cases = {
      {"sign", [](const Tensor& t) { return sign(t); }},
      {"abs", [](const Tensor& t) { return abs(t); }},
      {"where", [&](const Tensor& t) { return where(mask.to(t.device()), t, other.to(t.dtype()).to(t.device())); }},
      {"where broadcast",
       [&](const Tensor& t) {
         return where(reshape(mask, {17, 59}).to(t.device()), reshape(t, {17, 59}),
                      scalar_tensor(0.5).to(t.dtype()).to(t.device()));
       }},
      {"lerp scalar", [&](const Tensor& t) { return lerp(t, other.to(t.dtype()).to(t.device()), 0.9); }},
      {"lerp tensor",
       [&](const Tensor& t) { return lerp(other.to(t.dtype()).to(t.device()), t, w.to(t.dtype()).to(t.device())); }},
  };
  for (const auto& [name, f] : cases) {
    for (DType dtype : {DType::Float32, DType::BFloat16}) {
      SCOPED_TRACE(std::string(name) + " in " + dtype_name(dtype));
      std::vector<double> g_cpu, g_gpu;
      std::vector<double> y_cpu = run(x, Device::cpu(), dtype, f, &g_cpu);
      std::vector<double> y_gpu = run(x, Device::cuda(0), dtype, f, &g_gpu);
      // Same formulas, same rounding points: the elementwise results agree exactly.
      EXPECT_EQ(y_gpu, y_cpu);
      EXPECT_EQ(g_gpu, g_cpu);
    }
  }
}

}  // namespace
}  // namespace dpt
