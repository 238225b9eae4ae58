#include "optim/optimizer.h"

#include <set>

#include "core/autograd.h"
#include "core/error.h"
#include "core/factory.h"

namespace dpt::optim {

std::vector<ParamGroup> weight_decay_groups(const NamedTensors& params, double weight_decay) {
  ParamGroup decay, no_decay;
  decay.weight_decay = weight_decay;
  for (const auto& entry : params) (entry.second.dim() >= 2 ? decay : no_decay).params.push_back(entry);
  std::vector<ParamGroup> groups;
  if (!decay.params.empty()) groups.push_back(std::move(decay));
  if (!no_decay.params.empty()) groups.push_back(std::move(no_decay));
  return groups;
}

Optimizer::Optimizer(std::vector<ParamGroup> groups, double lr, std::vector<std::string> state_names)
    : groups_(std::move(groups)), lr_(lr), state_names_(std::move(state_names)) {
  std::set<std::string> names;
  std::set<const TensorImpl*> seen;
  for (const auto& group : groups_) {
    state_.emplace_back();
    for (const auto& [name, p] : group.params) {
      DPT_CHECK(p.defined() && p.is_leaf() && p.requires_grad(),
                "optimizer: parameter '{}' must be a leaf tensor that requires grad", name);
      DPT_CHECK(names.insert(name).second, "optimizer: parameter name '{}' appears twice", name);
      DPT_CHECK(seen.insert(p.impl()).second, "optimizer: parameter '{}' is the same tensor as an earlier one", name);
      DPT_CHECK(p.is_contiguous(), "optimizer: parameter '{}' must be contiguous", name);
      std::vector<Tensor> per_param;
      for (size_t s = 0; s < state_names_.size(); ++s) per_param.push_back(zeros(p.shape(), p.options()));
      state_.back().push_back(std::move(per_param));
    }
  }
}

void Optimizer::step() {
  NoGradGuard no_grad;
  ++step_;
  for (size_t g = 0; g < groups_.size(); ++g) update_group(g, step_);
}

void Optimizer::zero_grad(bool set_to_none) {
  for (const auto& group : groups_)
    for (const auto& [name, p] : group.params) p.zero_grad(set_to_none);
}

NamedTensors Optimizer::state_dict() const {
  NamedTensors out;
  out.emplace_back("step", from_vector<int64_t>({step_}, {}, TensorOptions{}.with_dtype(DType::Int64)));
  for (size_t g = 0; g < groups_.size(); ++g)
    for (size_t i = 0; i < groups_[g].params.size(); ++i)
      for (size_t s = 0; s < state_names_.size(); ++s)
        out.emplace_back(state_names_[s] + "." + groups_[g].params[i].first, state_[g][i][s]);
  return out;
}

void Optimizer::load_state_dict(const NamedTensors& state) {
  auto find = [&](const std::string& name) -> const Tensor* {
    for (const auto& [n, t] : state)
      if (n == name) return &t;
    return nullptr;
  };
  const Tensor* step = find("step");
  DPT_CHECK(step != nullptr && step->numel() == 1 && step->dtype() == DType::Int64,
            "optimizer load_state_dict: missing int64 scalar 'step'");
  // 1. Check every entry first, 2. then copy: a bad state leaves the optimizer untouched.
  std::vector<std::pair<Tensor, const Tensor*>> copies;
  for (size_t g = 0; g < groups_.size(); ++g) {
    for (size_t i = 0; i < groups_[g].params.size(); ++i) {
      for (size_t s = 0; s < state_names_.size(); ++s) {
        std::string name = state_names_[s] + "." + groups_[g].params[i].first;
        const Tensor& dst = state_[g][i][s];
        const Tensor* src = find(name);
        DPT_CHECK(src != nullptr, "optimizer load_state_dict: missing '{}'", name);
        DPT_CHECK(src->shape() == dst.shape() && src->dtype() == dst.dtype(),
                  "optimizer load_state_dict: '{}' is {} {}, expected {} {}", name, shape_str(src->shape()),
                  dtype_name(src->dtype()), shape_str(dst.shape()), dtype_name(dst.dtype()));
        copies.emplace_back(dst, src);
      }
    }
  }
  DPT_CHECK(state.size() == copies.size() + 1, "optimizer load_state_dict: {} entries given, expected {}",
            state.size(), copies.size() + 1);
  for (auto& [dst, src] : copies) {
    Tensor d = dst;
    d.copy_(*src);
  }
  step_ = static_cast<int64_t>(step->item());
}

}  // namespace dpt::optim
