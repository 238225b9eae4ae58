#pragma once
// DistributedSampler: the share of a dataset one rank visits in an epoch.
//
// Every rank computes the same global order (a permutation keyed by seed and epoch when shuffling,
// else 0..n-1), then makes its length a multiple of the world size — padding by repeating indices
// from the start of the order, or dropping the tail when drop_last — and takes every world-th entry
// starting at its rank: rank r visits order[r], order[r + W], order[r + 2W], ...
// Consequences the tests check: every rank gets the same number of indices (so every rank runs the
// same number of steps and issues the same collectives); without drop_last the union over ranks is
// the whole dataset; and at step k the ranks together hold order[k·B·W, (k+1)·B·W) when each takes
// batches of B — exactly the batch one process with batch B·W would take at step k, so N ranks ×
// batch b reproduce one process × batch N·b.
#include <cstdint>
#include <vector>

#include "data/sampler.h"

namespace dpt::dist {

class DistributedSampler : public data::Sampler {
 public:
  struct Options {
    bool shuffle = true;
    uint64_t seed = 0;
    bool drop_last = false;  // drop the tail instead of padding
  };

  // Throws when rank is outside [0, world_size), or with drop_last when the dataset is smaller than
  // the world (some rank would get nothing).
  DistributedSampler(int64_t dataset_size, int rank, int world_size, Options options);
  DistributedSampler(int64_t dataset_size, int rank, int world_size)
      : DistributedSampler(dataset_size, rank, world_size, Options{}) {}

  int64_t size() const override { return num_samples_; }  // per rank, per epoch
  std::vector<int64_t> epoch_indices(int64_t epoch) const override;

  int64_t total_size() const { return num_samples_ * world_size_; }  // over all ranks, padding included
  int rank() const { return rank_; }
  int world_size() const { return world_size_; }

 private:
  int64_t dataset_size_;
  int rank_;
  int world_size_;
  Options options_;
  int64_t num_samples_ = 0;
};

}  // namespace dpt::dist
