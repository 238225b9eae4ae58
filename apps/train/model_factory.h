#pragma once
// Builds the model a config names through its registry entry (apps/train/components.h), sized from the
// data (input width, classes, vocabulary), and knows how to turn a batch into a loss and how many FLOPs a
// step costs (for MFU, counted as dpt-bench does).
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "config.h"
#include "core/factory.h"
#include "data/dataset.h"
#include "data_factory.h"
#include "layers/module.h"

namespace dpt::train {

class Model {
 public:
  // Initialises the weights from `gen` (GPT's dropout keeps drawing from it afterwards, so it must
  // outlive the model). Throws naming the config key when the data does not fit the model.
  Model(const Config& config, const DataShape& shape, Generator& gen);

  const std::shared_ptr<nn::Module>& module() const { return module_; }
  // Mean loss of a batch already on the model's device. Feature inputs are cast to `compute` (bf16
  // under mixed precision); the loss is float32 either way.
  Tensor loss(const data::Batch& batch, DType compute) const;

  bool is_gpt() const { return kind_ == "gpt"; }
  // An MLP or CNN on class labels: validation also reports accuracy.
  bool is_classifier() const { return !is_gpt() && !regression_; }
  // A classifier's mean loss of a batch and how many of its examples have their label as the largest
  // logit (the first largest, on ties), from one forward pass.
  struct Scored {
    Tensor loss;
    int64_t correct = 0;
  };
  Scored score(const data::Batch& batch, DType compute) const;
  // What throughput counts: tokens for GPT, samples otherwise.
  const char* unit() const { return is_gpt() ? "tokens" : "samples"; }
  int64_t units_per_example() const { return is_gpt() ? seq_len_ : 1; }
  // Model FLOPs per unit (forward + backward), or 0 when not counted (CNN).
  double flops_per_unit() const { return flops_per_unit_; }
  int64_t num_parameters() const { return module_->num_parameters(); }
  // "gpt: 2 layers, 4 heads, width 64, vocab 65, context 64 (0.10M parameters)".
  const std::string& description() const { return description_; }

 private:
  std::string kind_;
  std::shared_ptr<nn::Module> module_;
  std::function<Tensor(nn::Module&, const data::Batch&, DType)> loss_;
  bool regression_ = false;
  int64_t seq_len_ = 0;
  double flops_per_unit_ = 0;
  std::string description_;
};

}  // namespace dpt::train
