// Counter-based random numbers: reproducible by seed, well distributed, fresh on every draw.
#include <gtest/gtest.h>

#include <cmath>

#include "core/factory.h"
#include "core/error.h"
#include "core/kernels.h"
#include "core/ops.h"
#include "core/philox.h"

namespace dpt {
namespace {

const TensorOptions kF64 = TensorOptions{}.with_dtype(DType::Float64);

TEST(Random, SameSeedGivesSameNumbers) {
  Generator a(42), b(42);
  EXPECT_EQ(randn({100}, a).to_vector<float>(), randn({100}, b).to_vector<float>());
  EXPECT_EQ(rand({100}, a).to_vector<float>(), rand({100}, b).to_vector<float>());
  Generator c(42), d(43);
  EXPECT_NE(randn({100}, c).to_vector<float>(), randn({100}, d).to_vector<float>());
}

TEST(Random, SuccessiveDrawsDifferAndAdvanceTheOffset) {
  Generator gen(7);
  auto first = randn({64}, gen).to_vector<float>();
  EXPECT_EQ(gen.offset(), 64u);
  auto second = randn({64}, gen).to_vector<float>();
  EXPECT_NE(first, second);
  // Restoring the state replays the second draw: (seed, offset) is the whole state.
  gen.set_state(7, 64);
  EXPECT_EQ(randn({64}, gen).to_vector<float>(), second);
}

TEST(Random, ElementIIsPhiloxOfSeedAndOffsetPlusI) {
  Generator gen(99);
  gen.advance(10);
  auto v = randn({5}, gen, kF64).to_vector<double>();
  for (uint64_t i = 0; i < 5; ++i) EXPECT_EQ(v[i], static_cast<double>(philox::normal_at(99, 10, i)));
}

TEST(Random, NormalHasRequestedMeanAndStd) {
  Generator gen(3);
  auto v = randn({100000}, gen, kF64, 2.0, 3.0).to_vector<double>();
  double mean = 0, sq = 0;
  for (double x : v) mean += x;
  mean /= static_cast<double>(v.size());
  for (double x : v) sq += (x - mean) * (x - mean);
  double stddev = std::sqrt(sq / static_cast<double>(v.size()));
  EXPECT_NEAR(mean, 2.0, 0.03);  // standard error 3 / sqrt(1e5) ~ 0.0095
  EXPECT_NEAR(stddev, 3.0, 0.03);
}

TEST(Random, UniformStaysInRangeWithUniformMoments) {
  Generator gen(5);
  auto v = rand({100000}, gen, kF64, -1.0, 3.0).to_vector<double>();
  double mean = 0, sq = 0;
  for (double x : v) {
    EXPECT_GE(x, -1.0);
    EXPECT_LE(x, 3.0);
    mean += x;
  }
  mean /= static_cast<double>(v.size());
  for (double x : v) sq += (x - mean) * (x - mean);
  EXPECT_NEAR(mean, 1.0, 0.02);
  EXPECT_NEAR(sq / static_cast<double>(v.size()), 16.0 / 12.0, 0.02);  // (b - a)^2 / 12
}

TEST(Random, RandintCoversTheHalfOpenRange) {
  Generator gen(11);
  auto v = randint({10000}, 3, 7, gen, TensorOptions{}.with_dtype(DType::Int64)).to_vector<int64_t>();
  std::vector<int> counts(4, 0);
  for (int64_t x : v) {
    ASSERT_GE(x, 3);
    ASSERT_LT(x, 7);
    ++counts[static_cast<size_t>(x - 3)];
  }
  for (int c : counts) EXPECT_NEAR(c, 2500, 200);
}

TEST(Random, BFloat16DrawIsTheRoundedFloatDraw) {
  Generator a(8), b(8);
  auto f = randn({256}, a).to_vector<float>();
  auto h = randn({256}, b, TensorOptions{}.with_dtype(DType::BFloat16)).to_vector<float>();
  for (size_t i = 0; i < f.size(); ++i) EXPECT_EQ(h[i], static_cast<float>(bf16(f[i])));
}

// Dropout's kernel keeps element i when uniform_at(seed, offset + i) > p and scales it by 1 / (1 - p); the
// backward applies the very same mask to the gradient.
TEST(Random, DropoutKeepsByThePhiloxDrawAndItsBackwardUsesTheSameMask) {
  Generator gen(21);
  gen.set_state(21, 1000);
  Tensor x = ones({4096}, kF64);
  x.requires_grad_();
  Tensor y = dropout(x, 0.25, gen);
  EXPECT_EQ(gen.offset(), 1000u + 4096u);
  std::vector<double> out = y.to_vector<double>();
  int64_t kept = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    const bool keep = philox::dropout_uniform_at(21, 1000, i) > 0.25f;
    EXPECT_EQ(out[i], keep ? 1.0 / 0.75 : 0.0) << i;
    kept += keep;
  }
  EXPECT_NEAR(static_cast<double>(kept) / 4096.0, 0.75, 0.03);
  sum(y).backward();
  EXPECT_EQ(x.grad().to_vector<double>(), out);
}

// The GPU kernel's integer test (keep_bits against keep_threshold) keeps exactly the elements whose 16-bit
// uniform exceeds p, for every half of many Philox words, with p on and off multiples of 2^-16.
TEST(Random, IntegerKeepTestEqualsTheUniformComparison) {
  for (float p : {0.0f, 0.1f, 0.2f, 0.25f, 0.5f, 0.9f, 1.0f / 65536.0f}) {
    const uint32_t threshold = philox::keep_threshold(p);
    for (uint64_t group = 0; group < 2000; ++group) {
      const philox::Words w = philox::dropout_words(77, group);
      const uint32_t bits = philox::keep_bits(w, threshold);
      for (uint64_t i = 0; i < philox::kDropoutGroup; ++i) {
        ASSERT_EQ(((bits >> i) & 1) != 0, philox::half_of(w, i) > p) << "p " << p << " group " << group << " half " << i;
      }
    }
  }
}

// dropout_add is residual + dropout(x) from the same generator state, in one kernel: in float64 the same
// values; its backward passes the gradient to the residual and the masked gradient to x.
TEST(Random, DropoutAddIsTheResidualPlusDropoutWithTheSameMask) {
  Generator a(8), b(8);
  a.set_state(8, 3);  // an offset no multiple of the Philox group
  b.set_state(8, 3);
  Generator values(4);
  Tensor x = randn({1001}, values, kF64), residual = randn({1001}, values, kF64);
  x.requires_grad_();
  residual.requires_grad_();
  Tensor y = dropout_add(x, residual, 0.3, a);
  EXPECT_EQ(a.offset(), 3u + 1001u);
  const std::vector<double> want = (residual.detach() + dropout(x.detach(), 0.3, b)).to_vector<double>();
  EXPECT_EQ(y.to_vector<double>(), want);
  sum(y).backward();
  EXPECT_EQ(residual.grad().to_vector<double>(), std::vector<double>(1001, 1.0));
  const std::vector<double> gx = x.grad().to_vector<double>();
  for (size_t i = 0; i < gx.size(); ++i) {
    const bool keep = philox::dropout_uniform_at(8, 3, i) > 0.3f;
    EXPECT_EQ(gx[i], keep ? 1.0 / 0.7 : 0.0) << i;
  }
}

// While a CUDA graph is captured, draws are relative to the device counter the graph moves on; a draw at a
// fixed host offset would repeat every replay and is refused.
TEST(Random, CapturedDrawsAreRelativeToTheDeviceCounter) {
  Generator gen(5);
  gen.set_state(5, 77);
  Tensor counter = from_vector<int64_t>({77}, {1}, TensorOptions{}.with_dtype(DType::Int64));
  const auto* base = reinterpret_cast<const uint64_t*>(counter.data<int64_t>());
  gen.begin_capture(base);
  const PhiloxArgs a = gen.draw(10), b = gen.draw(6);
  EXPECT_THROW(gen.advance(3), Error);
  EXPECT_EQ(gen.end_capture(), 16u);
  EXPECT_EQ(a.base, base);
  EXPECT_EQ(a.offset, 0u);
  EXPECT_EQ(b.offset, 10u);
  EXPECT_EQ(gen.offset(), 77u);  // the host moves on per replay (skip), not per captured draw
  kernels::advance_counter(counter, 16);
  gen.skip(16);
  EXPECT_EQ(counter.to_vector<int64_t>()[0], static_cast<int64_t>(gen.offset()));
  EXPECT_EQ(gen.draw(1).offset, 93u);
}

}  // namespace
}  // namespace dpt
