#include "distributed/sampler.h"

#include <numeric>

#include "core/error.h"
#include "data/permutation.h"

namespace dpt::dist {

DistributedSampler::DistributedSampler(int64_t dataset_size, int rank, int world_size, Options options)
    : dataset_size_(dataset_size), rank_(rank), world_size_(world_size), options_(options) {
  DPT_CHECK(world_size >= 1, "DistributedSampler: world_size must be >= 1, got {}", world_size);
  DPT_CHECK(rank >= 0 && rank < world_size, "DistributedSampler: rank {} is outside [0, {})", rank, world_size);
  DPT_CHECK(dataset_size > 0, "DistributedSampler: the dataset is empty");
  if (options_.drop_last) {
    num_samples_ = dataset_size / world_size;
    DPT_CHECK(num_samples_ > 0,
              "DistributedSampler: {} examples cannot give each of {} ranks one with drop_last; use a larger "
              "dataset or padding (drop_last false)",
              dataset_size, world_size);
  } else {
    num_samples_ = (dataset_size + world_size - 1) / world_size;
  }
}

std::vector<int64_t> DistributedSampler::epoch_indices(int64_t epoch) const {
  std::vector<int64_t> order;
  if (options_.shuffle) {
    order = data::permutation(dataset_size_, options_.seed, epoch);
  } else {
    order.resize(static_cast<size_t>(dataset_size_));
    std::iota(order.begin(), order.end(), int64_t{0});
  }
  const int64_t total = total_size();
  if (total < dataset_size_) {
    order.resize(static_cast<size_t>(total));  // drop_last: the tail no rank could share evenly
  } else {
    // Pad by repeating from the start (cycling, for a dataset smaller than the padding itself).
    for (int64_t i = dataset_size_; i < total; ++i) order.push_back(order[static_cast<size_t>(i - dataset_size_)]);
  }
  std::vector<int64_t> mine;
  mine.reserve(static_cast<size_t>(num_samples_));
  for (int64_t i = rank_; i < total; i += world_size_) mine.push_back(order[static_cast<size_t>(i)]);
  return mine;
}

}  // namespace dpt::dist
