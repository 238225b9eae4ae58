#pragma once
// Dataset: random access to examples by index. A batch is gathered from a list of indices, so the
// sampler (which indices, in which order, on which rank) stays apart from the data (what an index
// holds). get_batch is const and must be safe to call from the loader's background thread.
// The epoch is passed along for datasets whose example i is drawn afresh each epoch (random token
// windows); a batch is a pure function of (indices, epoch), so resuming at a position is exact.
#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace dpt::data {

// Inputs and targets of a batch; the first dimension of both is the batch size.
struct Batch {
  Tensor input;
  Tensor target;
};

class Dataset {
 public:
  virtual ~Dataset() = default;

  virtual int64_t size() const = 0;
  // Host tensors for the examples at `indices` (each in [0, size())) of `epoch`, in that order.
  Batch get_batch(const std::vector<int64_t>& indices, int64_t epoch = 0) const;
  // What this dataset is, for messages ("token file 'train.bin' (1000 tokens)").
  virtual std::string describe() const = 0;

  Batch get(int64_t index, int64_t epoch = 0) const { return get_batch({index}, epoch); }  // a batch of one

 protected:
  // get_batch after the indices were checked.
  virtual Batch gather(const std::vector<int64_t>& indices, int64_t epoch) const = 0;

 private:
  // Throws naming this dataset when an index is outside [0, size()).
  void check_indices(const std::vector<int64_t>& indices) const;
};

}  // namespace dpt::data
