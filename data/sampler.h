#pragma once
// Samplers decide which dataset indices a process visits in an epoch, and in which order. The Loader
// asks for a whole epoch at a time with the epoch number passed in, so a sampler is a pure function
// of (epoch) and safe to query from the loader's thread. The interface is header-only so that
// dist::DistributedSampler can implement it without a link dependency on the data library.
#include <cstdint>
#include <vector>

namespace dpt::data {

class Sampler {
 public:
  virtual ~Sampler() = default;
  // Number of indices this process visits per epoch.
  virtual int64_t size() const = 0;
  // The indices of `epoch`, in visiting order (size() of them).
  virtual std::vector<int64_t> epoch_indices(int64_t epoch) const = 0;

  // PyTorch-style stateful use: set_epoch(e) then indices().
  void set_epoch(int64_t epoch) { epoch_ = epoch; }
  int64_t epoch() const { return epoch_; }
  std::vector<int64_t> indices() const { return epoch_indices(epoch_); }

 private:
  int64_t epoch_ = 0;
};

// 0, 1, ..., n-1 every epoch.
class SequentialSampler : public Sampler {
 public:
  explicit SequentialSampler(int64_t n);
  int64_t size() const override { return n_; }
  std::vector<int64_t> epoch_indices(int64_t epoch) const override;

 private:
  int64_t n_;
};

// A fresh permutation of [0, n) per epoch, from (seed, epoch) (see permutation.h).
class RandomSampler : public Sampler {
 public:
  RandomSampler(int64_t n, uint64_t seed);
  int64_t size() const override { return n_; }
  std::vector<int64_t> epoch_indices(int64_t epoch) const override;

 private:
  int64_t n_;
  uint64_t seed_;
};

}  // namespace dpt::data
