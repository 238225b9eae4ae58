#pragma once
// The shuffle every sampler uses: a Fisher-Yates permutation of [0, n) driven by counter-based random
// numbers keyed by (seed, epoch). It is defined here rather than by std::shuffle, whose output differs
// between standard libraries, so a run shuffles identically on every machine and every rank.
// Header-only: the DistributedSampler (distributed/) uses it without linking the data library.
#include <cstdint>
#include <numeric>
#include <utility>
#include <vector>

#include "data/counter_random.h"

namespace dpt::data {

inline std::vector<int64_t> permutation(int64_t n, uint64_t seed, int64_t epoch) {
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), int64_t{0});
  // Stream = epoch, so epochs give independent permutations of the same seed.
  for (int64_t i = n - 1; i > 0; --i) {
    auto j = static_cast<int64_t>(
        random::below(seed, static_cast<uint64_t>(epoch), static_cast<uint64_t>(i), static_cast<uint64_t>(i + 1)));
    std::swap(order[static_cast<size_t>(i)], order[static_cast<size_t>(j)]);
  }
  return order;
}

}  // namespace dpt::data
