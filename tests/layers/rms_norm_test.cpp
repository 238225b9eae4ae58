// RMSNorm, the README's worked example of a new layer: a known answer, float64 finite-difference
// gradients with respect to input and weight, and module plumbing (parameter name, shape errors).
#include "layers/rms_norm.h"

#include <gtest/gtest.h>

#include <cmath>

#include "core/error.h"
#include "core/factory.h"
#include "core/gradcheck.h"

namespace dpt::nn {
namespace {

const TensorOptions kF64 = TensorOptions{}.with_dtype(DType::Float64);

TEST(RMSNorm, DividesEachRowByItsRootMeanSquare) {
  RMSNorm norm(2, /*eps=*/0.0);
  Tensor x = from_vector<float>({3, 4, -1, 1}, {2, 2});
  std::vector<float> y = norm(x).to_vector<float>();
  const double r0 = std::sqrt((9.0 + 16.0) / 2.0), r1 = 1.0;
  EXPECT_NEAR(y[0], 3 / r0, 1e-6);
  EXPECT_NEAR(y[1], 4 / r0, 1e-6);
  EXPECT_NEAR(y[2], -1 / r1, 1e-6);
  EXPECT_NEAR(y[3], 1 / r1, 1e-6);
}

TEST(RMSNorm, ScalesByItsWeight) {
  RMSNorm norm(2, 0.0);
  norm.weight.copy_(from_vector<float>({2, -0.5}, {2}));
  std::vector<float> y = norm(from_vector<float>({1, 1}, {1, 2})).to_vector<float>();
  EXPECT_NEAR(y[0], 2.0, 1e-6);
  EXPECT_NEAR(y[1], -0.5, 1e-6);
}

TEST(RMSNorm, GradientsMatchFiniteDifferencesForInputAndWeight) {
  Generator gen(7);
  expect_gradients_match([](const std::vector<Tensor>& in) { return rms_norm(in[0], in[1], 1e-6); },
                         {randn({3, 4, 5}, gen, kF64), randn({5}, gen, kF64, 1.0, 0.3)}, 1e-6);
}

TEST(RMSNorm, RegistersOneWeightAndRejectsAWrongWidth) {
  RMSNorm norm(8);
  auto params = norm.named_parameters();
  ASSERT_EQ(params.size(), 1u);
  EXPECT_EQ(params[0].first, "weight");
  EXPECT_EQ(params[0].second.shape(), (Shape{8}));
  EXPECT_THROW(norm(zeros({2, 7})), dpt::Error);
}

}  // namespace
}  // namespace dpt::nn
