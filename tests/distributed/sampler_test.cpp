#include "data/sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>

#include "distributed/sampler.h"

namespace dpt::dist {
namespace {

std::vector<std::vector<int64_t>> all_ranks(int64_t n, int world, DistributedSampler::Options o, int64_t epoch) {
  std::vector<std::vector<int64_t>> out;
  for (int r = 0; r < world; ++r) out.push_back(DistributedSampler(n, r, world, o).epoch_indices(epoch));
  return out;
}

TEST(DistributedSampler, EveryRankGetsTheSameCountAndTheUnionIsTheWholeDataset) {
  for (int64_t n : {1, 7, 10, 12, 101}) {
    for (int world : {1, 2, 3, 4, 8}) {
      for (bool shuffle : {false, true}) {
        auto ranks = all_ranks(n, world, {.shuffle = shuffle, .seed = 5}, 3);
        const int64_t per_rank = (n + world - 1) / world;
        std::map<int64_t, int> seen;
        for (auto& r : ranks) {
          EXPECT_EQ(static_cast<int64_t>(r.size()), per_rank) << "n " << n << " world " << world;
          for (int64_t i : r) seen[i]++;
        }
        EXPECT_EQ(static_cast<int64_t>(seen.size()), n) << "n " << n << " world " << world;  // union == all
        int repeats = 0;
        for (auto& [index, count] : seen) {
          EXPECT_GE(index, 0);
          EXPECT_LT(index, n);
          repeats += count - 1;
        }
        EXPECT_EQ(repeats, per_rank * world - n);  // padding only
      }
    }
  }
}

TEST(DistributedSampler, DropLastGivesDisjointEqualShares) {
  auto ranks = all_ranks(11, 3, {.shuffle = true, .seed = 1, .drop_last = true}, 0);
  std::set<int64_t> seen;
  for (auto& r : ranks) {
    EXPECT_EQ(r.size(), 3u);
    seen.insert(r.begin(), r.end());
  }
  EXPECT_EQ(seen.size(), 9u);  // 11 - 11 % 3, no repeats
  EXPECT_THROW(DistributedSampler(2, 0, 3, {.drop_last = true}), std::exception);
}

TEST(DistributedSampler, PadsByRepeatingFromTheStartOfTheOrder) {
  // No shuffle: order 0..9, padded to 12 with 0, 1; rank r takes every 4th from r.
  auto ranks = all_ranks(10, 4, {.shuffle = false}, 0);
  EXPECT_EQ(ranks[0], (std::vector<int64_t>{0, 4, 8}));
  EXPECT_EQ(ranks[1], (std::vector<int64_t>{1, 5, 9}));
  EXPECT_EQ(ranks[2], (std::vector<int64_t>{2, 6, 0}));
  EXPECT_EQ(ranks[3], (std::vector<int64_t>{3, 7, 1}));
}

TEST(DistributedSampler, MatchesTheSingleProcessOrderStepByStep) {
  // With batch b per rank, step k of W ranks covers exactly step k of one process with batch W·b.
  const int64_t n = 48, b = 3;
  const int world = 4;
  DistributedSampler single(n, 0, 1, {.seed = 9});
  auto global = single.epoch_indices(2);
  auto ranks = all_ranks(n, world, {.seed = 9}, 2);
  for (int64_t step = 0; step < n / (b * world); ++step) {
    std::multiset<int64_t> from_ranks, from_single;
    for (auto& r : ranks) from_ranks.insert(r.begin() + step * b, r.begin() + (step + 1) * b);
    from_single.insert(global.begin() + step * b * world, global.begin() + (step + 1) * b * world);
    EXPECT_EQ(from_ranks, from_single) << "step " << step;
  }
}

TEST(DistributedSampler, ShuffleDependsOnSeedAndEpochOnly) {
  DistributedSampler a(100, 1, 2, {.seed = 3}), b(100, 1, 2, {.seed = 3}), c(100, 1, 2, {.seed = 4});
  EXPECT_EQ(a.epoch_indices(0), b.epoch_indices(0));
  EXPECT_NE(a.epoch_indices(0), a.epoch_indices(1));
  EXPECT_NE(a.epoch_indices(0), c.epoch_indices(0));
  a.set_epoch(1);
  EXPECT_EQ(a.indices(), b.epoch_indices(1));
  // Usable wherever a data::Sampler is expected (the Loader).
  const data::Sampler& as_sampler = a;
  EXPECT_EQ(as_sampler.size(), 50);
}

TEST(DistributedSampler, RejectsBadRanksAndEmptyData) {
  EXPECT_THROW(DistributedSampler(10, 2, 2), std::exception);
  EXPECT_THROW(DistributedSampler(10, -1, 2), std::exception);
  EXPECT_THROW(DistributedSampler(10, 0, 0), std::exception);
  EXPECT_THROW(DistributedSampler(0, 0, 1), std::exception);
}

}  // namespace
}  // namespace dpt::dist
