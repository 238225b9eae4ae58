#include "data/sampler.h"

#include <numeric>

#include "core/error.h"
#include "data/permutation.h"

namespace dpt::data {

SequentialSampler::SequentialSampler(int64_t n) : n_(n) {
  DPT_CHECK(n >= 0, "SequentialSampler: expected a dataset size >= 0, got {}", n);
}

std::vector<int64_t> SequentialSampler::epoch_indices(int64_t) const {
  std::vector<int64_t> order(static_cast<size_t>(n_));
  std::iota(order.begin(), order.end(), int64_t{0});
  return order;
}

RandomSampler::RandomSampler(int64_t n, uint64_t seed) : n_(n), seed_(seed) {
  DPT_CHECK(n >= 0, "RandomSampler: expected a dataset size >= 0, got {}", n);
}

std::vector<int64_t> RandomSampler::epoch_indices(int64_t epoch) const { return permutation(n_, seed_, epoch); }

}  // namespace dpt::data
