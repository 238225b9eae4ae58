#include "optim/optimizer.h"

#include <set>

#include "core/autograd.h"
#include "core/error.h"
#include "core/factory.h"
#include "core/kernels.h"

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
      index_[p.impl()] = {state_.size() - 1, state_.back().size()};
      std::vector<Tensor> per_param;
      for (size_t s = 0; s < state_names_.size(); ++s) per_param.push_back(zeros(p.shape(), p.options()));
      state_.back().push_back(std::move(per_param));
    }
  }
}

void Optimizer::step() {
  if (!take_gate()) return;
  begin_step();
  run_updates();
}

bool Optimizer::take_gate() {
  if (!gate_.defined() || reads_gate_on_device()) return true;
  const std::vector<double> gate = gate_.to_vector<double>();
  if (gate[0] != 0) return false;
  grad_scale_ = gate[1];
  return true;
}

void Optimizer::set_gate(Tensor gate) {
  DPT_CHECK(!gate.defined() || (gate.numel() == 2 && gate.dtype() == DType::Float64 && gate.is_contiguous()),
            "optimizer set_gate: expected a contiguous float64 [2] {{skip, scale}}, got {} {}", shape_str(gate.shape()),
            gate.defined() ? dtype_name(gate.dtype()) : "undefined");
  gate_ = std::move(gate);
  on_set_gate();
}

void Optimizer::begin_step() {
  ++step_;
  on_begin_step();
}

void Optimizer::update(const std::vector<Tensor>& params) {
  DPT_CHECK(step_ > 0, "optimizer update: call begin_step() first");
  selected_.clear();
  for (const auto& group : groups_) selected_.emplace_back(group.params.size(), 0);
  for (const Tensor& t : params) {
    auto it = index_.find(t.impl());
    DPT_CHECK(it != index_.end(),
              "optimizer update: a tensor of shape {} is neither a parameter of this optimizer "
              "nor a compute twin of one",
              shape_str(t.shape()));
    selected_[it->second.first][it->second.second] = 1;
  }
  run_updates();
  selected_.clear();
}

void Optimizer::run_updates() {
  NoGradGuard no_grad;
  for (size_t g = 0; g < groups_.size(); ++g) {
    const bool scale_here = grad_scale_ != 1.0 && !applies_grad_scale(g);
    if (twins_.empty() || fuses_twins(g)) {
      if (scale_here) scale_grads(g);
      update_group(g, step_);
      continue;
    }
    // Staging: float32 copies of the twins' gradients, the usual update, then the results rounded into
    // the twins. Masters keep no gradient between steps.
    std::vector<size_t> staged;
    for (size_t i = 0; i < groups_[g].params.size(); ++i) {
      const Tensor& tw = twins_[g][i];
      if (!selected(g, i) || !tw.grad().defined()) continue;
      const Tensor& p = groups_[g].params[i].second;
      p.set_grad(tw.grad().to(p.dtype()));
      staged.push_back(i);
    }
    if (scale_here) scale_grads(g);
    update_group(g, step_);
    for (size_t i : staged) {
      Tensor tw = twins_[g][i];
      const Tensor& p = groups_[g].params[i].second;
      tw.copy_(p);
      p.set_grad(Tensor());
    }
  }
}

void Optimizer::scale_grads(size_t g) {
  for (size_t i = 0; i < groups_[g].params.size(); ++i) {
    const Tensor grad = groups_[g].params[i].second.grad();
    if (selected(g, i) && grad.defined()) kernels::unary(kernels::UnaryOp::Scale, grad, grad, grad_scale_);
  }
}

void Optimizer::set_compute_twins(const NamedTensors& twins) {
  std::unordered_map<std::string, Tensor> by_name;
  for (const auto& [name, t] : twins) by_name.emplace(name, t);
  std::vector<std::vector<Tensor>> table;
  for (const auto& group : groups_) {
    table.emplace_back();
    for (const auto& [name, p] : group.params) {
      auto it = by_name.find(name);
      DPT_CHECK(it != by_name.end(), "set_compute_twins: no twin named '{}'", name);
      const Tensor& tw = it->second;
      DPT_CHECK(tw.shape() == p.shape() && tw.device() == p.device() && tw.is_contiguous(),
                "set_compute_twins: twin '{}' is {} on {}, expected contiguous {} on {}", name, shape_str(tw.shape()),
                tw.device().str(), shape_str(p.shape()), p.device().str());
      table.back().push_back(tw);
      by_name.erase(it);
    }
  }
  DPT_CHECK(by_name.empty(), "set_compute_twins: twin '{}' matches no parameter of this optimizer",
            by_name.empty() ? "" : by_name.begin()->first);
  twins_ = std::move(table);
  for (size_t g = 0; g < twins_.size(); ++g)
    for (size_t i = 0; i < twins_[g].size(); ++i) index_[twins_[g][i].impl()] = {g, i};
}

void Optimizer::zero_grad(bool set_to_none) {
  for (const auto& group : groups_)
    for (const auto& [name, p] : group.params) p.zero_grad(set_to_none);
}

NamedTensors Optimizer::state_dict() const {
  settle();
  NamedTensors out;
  out.emplace_back("step", from_vector<int64_t>({step_count()}, {}, TensorOptions{}.with_dtype(DType::Int64)));
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
  DPT_CHECK(state.size() == copies.size() + 1, "optimizer load_state_dict: {} entries given, expected {}", state.size(),
            copies.size() + 1);
  for (auto& [dst, src] : copies) {
    Tensor d = dst;
    d.copy_(*src);
  }
  step_ = static_cast<int64_t>(step->item());
  on_load_step();
}

}  // namespace dpt::optim
