#include "distributed/shard_pieces.h"

#include <algorithm>

#include "core/autograd.h"
#include "core/error.h"
#include "core/factory.h"

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

Tensor ShardPieces::add(const std::string& name, const Tensor& param, int64_t begin, int64_t end, const Tensor& grad,
                        bool replicated) {
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
  elements_ += end - begin;
  pieces_of_rank_.push_back({name, begin, end, replicated});
  return piece;
}

std::unique_ptr<optim::Optimizer> ShardPieces::make_optimizer(const Factory& make) {
  for (const auto& [name, entry] : target_of_)
    DPT_CHECK(covered_.count(name), "{}: optimizer parameter '{}' is not one of DDP's parameters", owner_, name);
  DPT_CHECK(twins_.empty() || twins_.size() == pieces_of_rank_.size(),
            "{}: either every parameter has a float32 master or none does ({} of {} have one)", owner_, twins_.size(),
            pieces_of_rank_.size());
  std::unique_ptr<optim::Optimizer> inner = make(std::move(piece_groups_));
  DPT_CHECK(inner != nullptr, "{}: the optimizer factory returned nothing", owner_);
  if (!twins_.empty()) inner->set_compute_twins(twins_);
  return inner;
}

NamedTensors ShardPieces::assemble(ProcessGroup& group, const NamedTensors& params,
                                   const std::function<Tensor(const Piece&)>& local) const {
  NoGradGuard no_grad;
  std::unordered_map<std::string, int64_t> offset_of;
  int64_t total = 0;
  for (const auto& [name, p] : params) {
    offset_of.emplace(name, total);
    total += p.numel();
  }
  const Device device = params.empty() ? Device::cpu() : params.front().second.device();
  Tensor flat = zeros({total}, TensorOptions{}.with_dtype(DType::Float32).with_device(device));
  for (const Piece& piece : pieces_of_rank_) {
    if (piece.replicated && group.rank() != 0) continue;
    const int64_t at = offset_of.at(piece.param) + piece.begin;
    flat_range(flat, at, at + piece.end - piece.begin).copy_(local(piece));
  }
  group.allreduce(flat, ReduceOp::Sum)->wait();
  NamedTensors out;
  for (const auto& [name, p] : params) {
    const int64_t at = offset_of.at(name);
    out.emplace_back(name, flat.slice(at, at + p.numel()).reshape(p.shape()));
  }
  return out;
}

void ShardPieces::gather_targets(ProcessGroup& group, const NamedTensors& params) {
  NoGradGuard no_grad;
  // The same on every rank, so either every rank returns here or none does.
  const bool all_params = std::all_of(params.begin(), params.end(), [&](const auto& p) {
    return target_of_.at(p.first).second.same(p.second);
  });
  if (all_params) return;
  auto whole = assemble(group, params, [&](const Piece& piece) {
    return flat_range(target_of_.at(piece.param).second, piece.begin, piece.end).to(DType::Float32);
  });
  for (const auto& [name, t] : whole) target_of_.at(name).second.copy_(t);
}

NamedTensors ShardPieces::full_state_dict(const optim::Optimizer& inner, ProcessGroup& group,
                                          const NamedTensors& params) {
  std::unordered_map<std::string, Tensor> entry;  // "<state>.<piece>" -> this rank's state tensor
  NamedTensors full;
  for (const auto& [key, t] : inner.state_dict()) {
    if (key == "step") full.emplace_back(key, t);
    entry.emplace(key, t);
  }
  for (const std::string& state : inner.state_names()) {
    auto whole = assemble(group, params, [&](const Piece& piece) {
      const Tensor& t = entry.at(state + "." + piece_name(piece.param, piece.begin, piece.end));
      return t.reshape({t.numel()}).to(DType::Float32);
    });
    for (auto& [name, t] : whole) full.emplace_back(state + "." + name, t);
  }
  return full;
}

void ShardPieces::load_full_state_dict(optim::Optimizer& inner, const NamedTensors& full) const {
  std::unordered_map<std::string, Tensor> by_name;
  for (const auto& [name, t] : full) by_name.emplace(name, t);
  NamedTensors shard;
  auto step = by_name.find("step");
  DPT_CHECK(step != by_name.end(), "{}: the optimizer state has no 'step'", owner_);
  shard.emplace_back("step", step->second);
  for (const std::string& state : inner.state_names()) {
    for (const Piece& piece : pieces_of_rank_) {
      const std::string name = state + "." + piece.param;
      auto it = by_name.find(name);
      DPT_CHECK(it != by_name.end(), "{}: the optimizer state has no '{}'", owner_, name);
      const Tensor& t = it->second;
      const int64_t numel = target_of_.at(piece.param).second.numel();
      DPT_CHECK(t.numel() == numel && t.is_contiguous(),
                "{}: optimizer state '{}' is {}, expected {} elements like the parameter", owner_, name,
                shape_str(t.shape()), numel);
      shard.emplace_back(state + "." + piece_name(piece.param, piece.begin, piece.end),
                         flat_range(t, piece.begin, piece.end));
    }
  }
  inner.load_state_dict(shard);
}

}  // namespace dpt::dist
