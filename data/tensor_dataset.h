#pragma once
// TensorDataset: examples are the rows (first dimension) of an input and a target tensor in memory.
#include "data/dataset.h"

namespace dpt::data {

class TensorDataset : public Dataset {
 public:
  // Both tensors need the same first dimension; they are copied to contiguous host memory once.
  TensorDataset(const Tensor& inputs, const Tensor& targets, std::string name = "tensors");

  int64_t size() const override { return inputs_.size(0); }
  std::string describe() const override;

  const Tensor& inputs() const { return inputs_; }
  const Tensor& targets() const { return targets_; }

 protected:
  Batch gather(const std::vector<int64_t>& indices, int64_t epoch) const override;

 private:
  Tensor inputs_;
  Tensor targets_;
  std::string name_;
};

// Rows `indices` of a contiguous host tensor, gathered into a new [indices.size(), ...] tensor.
Tensor gather_rows(const Tensor& source, const std::vector<int64_t>& indices);

}  // namespace dpt::data
