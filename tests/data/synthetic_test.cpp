#include "data/synthetic.h"

#include <gtest/gtest.h>

#include <cmath>

#include "core/factory.h"
#include "data/tensor_dataset.h"
#include "temp_dir.h"

namespace dpt::data {
namespace {

using testing::expect_error_containing;

TEST(SyntheticClassification, SpiralsAreBalancedInsideTheUnitDiskAndSeeded) {
  ClassificationOptions o;
  o.num_samples = 300;
  o.num_classes = 3;
  o.seed = 5;
  auto a = make_synthetic_classification(o);
  auto b = make_synthetic_classification(o);
  o.seed = 6;
  auto c = make_synthetic_classification(o);
  ASSERT_EQ(a->size(), 300);
  EXPECT_EQ(a->inputs().shape(), (Shape{300, 2}));
  auto x = a->inputs().to_vector<float>();
  auto y = a->targets().to_vector<int32_t>();
  for (int64_t i = 0; i < 300; ++i) {
    EXPECT_EQ(y[i], i % 3);
    EXPECT_LE(std::hypot(x[2 * i], x[2 * i + 1]), 1.0f + 1e-6f);
  }
  EXPECT_EQ(x, b->inputs().to_vector<float>());
  EXPECT_NE(x, c->inputs().to_vector<float>());
}

TEST(SyntheticClassification, NoiselessClustersSitExactlyOnTheirCenters) {
  ClassificationOptions o;
  o.kind = "clusters";
  o.num_samples = 40;
  o.num_features = 5;
  o.num_classes = 4;
  o.noise = 0.0;
  auto ds = make_synthetic_classification(o);
  auto x = ds->inputs().to_vector<float>();
  for (int64_t i = 4; i < 40; ++i)
    for (int d = 0; d < 5; ++d) EXPECT_EQ(x[i * 5 + d], x[(i % 4) * 5 + d]);
  EXPECT_NE(x[0], x[5]);  // different classes, different centers
}

TEST(SyntheticClassification, BadOptionsAreErrors) {
  ClassificationOptions o;
  o.num_features = 3;
  expect_error_containing([&] { make_synthetic_classification(o); }, {"spirals", "num_features 2"});
  o.kind = "moons";
  expect_error_containing([&] { make_synthetic_classification(o); }, {"'spirals' or 'clusters'", "'moons'"});
  o.kind = "clusters";
  o.num_classes = 1;
  expect_error_containing([&] { make_synthetic_classification(o); }, {"num_classes must be >= 2"});
}

TEST(SyntheticRegression, NoiselessTargetsAreALinearFunctionOfInputs) {
  RegressionOptions o;
  o.num_samples = 20;
  o.num_features = 1;
  o.num_outputs = 1;
  o.noise = 0.0;
  auto ds = make_synthetic_regression(o);
  auto x = ds->inputs().to_vector<float>();
  auto y = ds->targets().to_vector<float>();
  const double w = y[0] / x[0];
  for (int i = 1; i < 20; ++i) EXPECT_NEAR(y[i], w * x[i], 1e-5 * (1 + std::abs(y[i])));
}

TEST(TensorDataset, GathersRowsInIndexOrder) {
  TensorDataset ds(from_vector(std::vector<float>{0, 1, 10, 11, 20, 21}, {3, 2}),
                   from_vector(std::vector<int32_t>{5, 6, 7}, {3}, TensorOptions{}.with_dtype(DType::Int32)));
  Batch b = ds.get_batch({2, 0, 2});
  EXPECT_EQ(b.input.to_vector<float>(), (std::vector<float>{20, 21, 0, 1, 20, 21}));
  EXPECT_EQ(b.target.to_vector<int32_t>(), (std::vector<int32_t>{7, 5, 7}));
  expect_error_containing([&] { ds.get(3); }, {"index 3 is outside [0, 3)"});
  expect_error_containing(
      [&] {
        TensorDataset bad(from_vector(std::vector<float>{1, 2}, {2}), from_vector(std::vector<float>{1, 2, 3}, {3}));
      },
      {"2 inputs but 3 targets"});
}

}  // namespace
}  // namespace dpt::data
