#include "data/synthetic.h"

#include <cmath>
#include <vector>

#include "core/error.h"
#include "core/factory.h"
#include "data/counter_random.h"

namespace dpt::data {

namespace {
// Independent random streams per purpose, so adding a feature never changes another's numbers.
constexpr uint64_t kStreamCenters = 101;
constexpr uint64_t kStreamNoise = 102;
constexpr uint64_t kStreamRadius = 103;
constexpr uint64_t kStreamInputs = 104;
constexpr uint64_t kStreamWeights = 105;
constexpr double kTwoPi = 6.283185307179586;
}  // namespace

std::shared_ptr<TensorDataset> make_synthetic_classification(const ClassificationOptions& o) {
  DPT_CHECK(o.num_samples > 0, "synthetic classification: num_samples must be > 0, got {}", o.num_samples);
  DPT_CHECK(o.num_features > 0, "synthetic classification: num_features must be > 0, got {}", o.num_features);
  DPT_CHECK(o.num_classes >= 2, "synthetic classification: num_classes must be >= 2, got {}", o.num_classes);
  DPT_CHECK(o.noise >= 0, "synthetic classification: noise must be >= 0, got {}", o.noise);
  const int64_t n = o.num_samples, f = o.num_features, c = o.num_classes;
  std::vector<float> x(static_cast<size_t>(n * f));
  std::vector<int32_t> y(static_cast<size_t>(n));
  if (o.kind == "spirals") {
    DPT_CHECK(f == 2, "synthetic classification: kind 'spirals' lives in the plane (num_features 2), got {}", f);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t label = i % c;
      // Radius uniform in (0, 1]; the arm turns 1.5 times from the center outwards.
      const double r = 1.0 - random::uniform(o.seed, kStreamRadius, static_cast<uint64_t>(i));
      const double angle = kTwoPi * (static_cast<double>(label) / static_cast<double>(c) + 0.75 * r) +
                           o.noise * random::normal(o.seed, kStreamNoise, static_cast<uint64_t>(i));
      x[static_cast<size_t>(2 * i)] = static_cast<float>(r * std::cos(angle));
      x[static_cast<size_t>(2 * i + 1)] = static_cast<float>(r * std::sin(angle));
      y[static_cast<size_t>(i)] = static_cast<int32_t>(label);
    }
  } else if (o.kind == "clusters") {
    std::vector<double> centers(static_cast<size_t>(c * f));
    for (size_t j = 0; j < centers.size(); ++j) centers[j] = random::normal(o.seed, kStreamCenters, j);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t label = i % c;
      for (int64_t d = 0; d < f; ++d) {
        const double center = centers[static_cast<size_t>(label * f + d)];
        const double noise = random::normal(o.seed, kStreamNoise, static_cast<uint64_t>(i * f + d));
        x[static_cast<size_t>(i * f + d)] = static_cast<float>(center + o.noise * noise);
      }
      y[static_cast<size_t>(i)] = static_cast<int32_t>(label);
    }
  } else {
    DPT_FAIL("synthetic classification: kind must be 'spirals' or 'clusters', got '{}'", o.kind);
  }
  return std::make_shared<TensorDataset>(from_vector(x, {n, f}),
                                         from_vector(y, {n}, TensorOptions{}.with_dtype(DType::Int32)),
                                         fmt::format("synthetic {} ({} classes)", o.kind, c));
}

std::shared_ptr<TensorDataset> make_synthetic_regression(const RegressionOptions& o) {
  DPT_CHECK(o.num_samples > 0, "synthetic regression: num_samples must be > 0, got {}", o.num_samples);
  DPT_CHECK(o.num_features > 0, "synthetic regression: num_features must be > 0, got {}", o.num_features);
  DPT_CHECK(o.num_outputs > 0, "synthetic regression: num_outputs must be > 0, got {}", o.num_outputs);
  DPT_CHECK(o.noise >= 0, "synthetic regression: noise must be >= 0, got {}", o.noise);
  const int64_t n = o.num_samples, f = o.num_features, k = o.num_outputs;
  std::vector<double> w(static_cast<size_t>(f * k));
  const double w_scale = 1.0 / std::sqrt(static_cast<double>(f));
  for (size_t j = 0; j < w.size(); ++j) w[j] = w_scale * random::normal(o.seed, kStreamWeights, j);
  std::vector<float> x(static_cast<size_t>(n * f));
  std::vector<float> y(static_cast<size_t>(n * k));
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t d = 0; d < f; ++d) {
      x[static_cast<size_t>(i * f + d)] =
          static_cast<float>(random::normal(o.seed, kStreamInputs, static_cast<uint64_t>(i * f + d)));
    }
    for (int64_t out = 0; out < k; ++out) {
      double acc = o.noise * random::normal(o.seed, kStreamNoise, static_cast<uint64_t>(i * k + out));
      for (int64_t d = 0; d < f; ++d) {
        acc += static_cast<double>(x[static_cast<size_t>(i * f + d)]) * w[static_cast<size_t>(d * k + out)];
      }
      y[static_cast<size_t>(i * k + out)] = static_cast<float>(acc);
    }
  }
  return std::make_shared<TensorDataset>(from_vector(x, {n, f}), from_vector(y, {n, k}),
                                         fmt::format("synthetic regression ({} -> {})", f, k));
}

}  // namespace dpt::data
