#include "model_factory.h"

#include <utility>

#include <spdlog/fmt/fmt.h>

#include "components.h"
#include "core/error.h"
#include "core/ops.h"
#include "layers/losses.h"

namespace dpt::train {

namespace {

std::string millions(int64_t n) {
  const auto x = static_cast<double>(n);
  return x >= 1e6 ? fmt::format("{:.2f}M parameters", x / 1e6) : fmt::format("{:.1f}k parameters", x / 1e3);
}

}  // namespace

Model::Model(const Config& config, const DataShape& shape, Generator& gen)
    : kind_(config.model.kind), regression_(shape.regression), seq_len_(shape.seq_len) {
  // Every model, built-in or added, is a registry entry (apps/train/models/).
  const auto* entry = models().find(kind_);
  DPT_CHECK(entry != nullptr, "model.kind: expected {}, got '{}'", fmt::join(models().names(), " | "), kind_);
  ModelParts parts = entry->make.make(config, Settings(config, "model." + kind_, entry->settings), shape, gen);
  DPT_CHECK(parts.module != nullptr && parts.loss, "model.kind {}: its factory returned no module or no loss", kind_);
  module_ = std::move(parts.module);
  loss_ = std::move(parts.loss);
  flops_per_unit_ = parts.flops_per_unit;
  description_ = fmt::format("{} ({})", parts.description, millions(module_->num_parameters()));
}

Tensor Model::loss(const data::Batch& batch, DType compute) const { return loss_(*module_, batch, compute); }

Model::Scored Model::score(const data::Batch& batch, DType compute) const {
  DPT_CHECK(is_classifier(), "Model::score: a {} model is not a classifier", kind_);
  Tensor out = module_->forward(batch.input.to(compute));
  const std::vector<int64_t> predicted = argmax(out, 1).to_vector<int64_t>();
  const std::vector<int64_t> labels = batch.target.to_vector<int64_t>();
  Scored s;
  for (size_t i = 0; i < predicted.size(); ++i) s.correct += predicted[i] == labels[i] ? 1 : 0;
  s.loss = nn::cross_entropy_loss(std::move(out), batch.target);
  return s;
}

}  // namespace dpt::train
