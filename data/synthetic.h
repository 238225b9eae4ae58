#pragma once
// Seeded synthetic datasets, generated in memory at construction. Example i is a pure function of
// (seed, i) (counter_random.h), so the data is the same on every rank and every run.
#include <cstdint>
#include <memory>
#include <string>

#include "data/tensor_dataset.h"

namespace dpt::data {

struct ClassificationOptions {
  int64_t num_samples = 1024;
  int64_t num_features = 2;
  int64_t num_classes = 3;
  // "spirals": num_classes interleaved arms in the plane (needs num_features == 2);
  // "clusters": one Gaussian blob per class around a random center in num_features dimensions.
  std::string kind = "spirals";
  double noise = 0.2;
  uint64_t seed = 0;
};

struct RegressionOptions {
  int64_t num_samples = 1024;
  int64_t num_features = 8;
  int64_t num_outputs = 1;
  double noise = 0.1;  // stddev of the Gaussian noise added to x·W
  uint64_t seed = 0;
};

// Inputs float32 [N, num_features], targets int32 [N] (class i % num_classes, so classes are balanced).
std::shared_ptr<TensorDataset> make_synthetic_classification(const ClassificationOptions& options);
// Inputs float32 [N, num_features] ~ N(0, 1), targets float32 [N, num_outputs] = x·W + noise, with
// W ~ N(0, 1/num_features) drawn from the same seed.
std::shared_ptr<TensorDataset> make_synthetic_regression(const RegressionOptions& options);

}  // namespace dpt::data
