#include "distributed/shard_pieces.h"

#include "core/error.h"

namespace dpt::dist {

Tensor flat_range(const Tensor& t, int64_t begin, int64_t end) {
  return make_view(t, {end - begin}, {1}, t.impl()->offset + begin);
}

ShardPieces::ShardPieces(std::string owner, const std::vector<optim::ParamGroup>& groups) : owner_(std::move(owner)) {
  for (size_t g = 0; g < groups.size(); ++g) {
    for (const auto& [name, t] : groups[g].params) target_of_.emplace(name, std::make_pair(g, t));
    piece_groups_.push_back({{}, groups[g].weight_decay, groups[g].lr_scale});
  }
}

const Tensor& ShardPieces::target(const std::string& name, const Tensor& param) {
  auto it = target_of_.find(name);
  DPT_CHECK(it != target_of_.end(), "{}: DDP parameter '{}' is in none of the optimizer's groups", owner_, name);
  const Tensor& t = it->second.second;
  DPT_CHECK(t.numel() == param.numel() && t.is_contiguous() && t.device() == param.device(),
            "{}: '{}' to update is {} on {}, expected a contiguous tensor like DDP's {} on {}", owner_, name,
            shape_str(t.shape()), t.device().str(), shape_str(param.shape()), param.device().str());
  covered_.insert(name);
  return t;
}

std::string ShardPieces::piece_name(const std::string& name, int64_t begin, int64_t end) {
  return fmt::format("{}[{}:{}]", name, begin, end);
}

void ShardPieces::cover(const std::string& name, const Tensor& param) { target(name, param); }

Tensor ShardPieces::add(const std::string& name, const Tensor& param, int64_t begin, int64_t end, const Tensor& grad) {
  const Tensor& t = target(name, param);
  const std::string piece_name = ShardPieces::piece_name(name, begin, end);
  Tensor piece = flat_range(t, begin, end);
  piece.requires_grad_(true);
  if (t.same(param)) {
    piece.set_grad(grad);
  } else {  // mixed precision: DDP's parameter is the compute twin of the float32 master
    Tensor twin = flat_range(param, begin, end);
    twin.set_grad(grad);
    twins_.emplace_back(piece_name, twin);
  }
  piece_groups_[target_of_.at(name).first].params.emplace_back(piece_name, piece);
  ++pieces_;
  elements_ += end - begin;
  return piece;
}

std::unique_ptr<optim::Optimizer> ShardPieces::make_optimizer(const Factory& make) {
  for (const auto& [name, entry] : target_of_)
    DPT_CHECK(covered_.count(name), "{}: optimizer parameter '{}' is not one of DDP's parameters", owner_, name);
  DPT_CHECK(twins_.empty() || twins_.size() == pieces_,
            "{}: either every parameter has a float32 master or none does ({} of {} have one)", owner_, twins_.size(),
            pieces_);
  std::unique_ptr<optim::Optimizer> inner = make(std::move(piece_groups_));
  DPT_CHECK(inner != nullptr, "{}: the optimizer factory returned nothing", owner_);
  if (!twins_.empty()) inner->set_compute_twins(twins_);
  return inner;
}

}  // namespace dpt::dist
