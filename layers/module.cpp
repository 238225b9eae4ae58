#include "layers/module.h"

#include <set>

#include "core/autograd.h"
#include "core/error.h"

namespace dpt::nn {

void replace_data(const Tensor& param, const Tensor& value) {
  TensorImpl* dst = param.impl();
  TensorImpl* src = value.impl();
  DPT_CHECK(dst != nullptr && src != nullptr, "replace_data: undefined tensor");
  dst->storage = src->storage;
  dst->offset = src->offset;
  dst->shape = src->shape;
  dst->strides = src->strides;
  dst->dtype = src->dtype;
  dst->device = src->device;
  param.set_grad(Tensor());
}

Tensor Module::forward(const Tensor&) {
  DPT_FAIL("this module has no single-input forward(); call its own forward signature");
}

void Module::check_new_name(const std::string& name) const {
  DPT_CHECK(!name.empty() && name.find('.') == std::string::npos,
            "module member names must be non-empty and contain no '.', got '{}'", name);
  for (const auto& [n, t] : params_) DPT_CHECK(n != name, "'{}' is already registered as a parameter", name);
  for (const auto& b : buffers_) DPT_CHECK(b.name != name, "'{}' is already registered as a buffer", name);
  for (const auto& [n, m] : children_) DPT_CHECK(n != name, "'{}' is already registered as a child module", name);
}

Tensor Module::register_parameter(const std::string& name, Tensor value) {
  check_new_name(name);
  DPT_CHECK(value.defined() && is_floating(value.dtype()), "parameter '{}' must be a defined floating tensor", name);
  DPT_CHECK(value.is_leaf(), "parameter '{}' must be a leaf tensor (create it under no-grad or detach it)", name);
  value.requires_grad_(true);
  params_.emplace_back(name, value);
  return value;
}

Tensor Module::register_buffer(const std::string& name, Tensor value, bool persistent) {
  check_new_name(name);
  DPT_CHECK(value.defined(), "buffer '{}' is undefined", name);
  buffers_.push_back({name, value, persistent});
  return value;
}

void Module::add_child(const std::string& name, std::shared_ptr<Module> module) {
  check_new_name(name);
  DPT_CHECK(module != nullptr, "child module '{}' is null", name);
  children_.emplace_back(name, std::move(module));
}

void Module::collect(const std::string& prefix, NamedTensors* params, NamedTensors* buffers,
                     bool persistent_only) const {
  if (params)
    for (const auto& [n, t] : params_) params->emplace_back(prefix + n, t);
  if (buffers)
    for (const auto& b : buffers_)
      if (b.persistent || !persistent_only) buffers->emplace_back(prefix + b.name, b.tensor);
  for (const auto& [n, m] : children_) m->collect(prefix + n + ".", params, buffers, persistent_only);
}

namespace {
// Keeps the first occurrence of each tensor (shared weights appear once, under their first path).
NamedTensors unique_tensors(NamedTensors all) {
  std::set<const TensorImpl*> seen;
  NamedTensors out;
  for (auto& [n, t] : all)
    if (seen.insert(t.impl()).second) out.emplace_back(std::move(n), std::move(t));
  return out;
}
}  // namespace

NamedTensors Module::named_parameters() const {
  NamedTensors all;
  collect("", &all, nullptr, false);
  return unique_tensors(std::move(all));
}

std::vector<Tensor> Module::parameters() const {
  std::vector<Tensor> out;
  for (auto& [n, t] : named_parameters()) out.push_back(t);
  return out;
}

NamedTensors Module::named_buffers() const {
  NamedTensors all;
  collect("", nullptr, &all, false);
  return unique_tensors(std::move(all));
}

int64_t Module::num_parameters() const {
  int64_t n = 0;
  for (const auto& [name, t] : named_parameters()) n += t.numel();
  return n;
}

void Module::train(bool on) {
  training_ = on;
  for (auto& [n, m] : children_) m->train(on);
}

void Module::to(Device device) {
  NoGradGuard no_grad;
  for (auto& [n, t] : named_parameters())
    if (t.device() != device) replace_data(t, t.detach().to(device));
  for (auto& [n, t] : named_buffers())
    if (t.device() != device) replace_data(t, t.detach().to(device));
}

void Module::to(DType dtype) {
  DPT_CHECK(is_floating(dtype), "Module::to: {} is not a floating dtype", dtype_name(dtype));
  NoGradGuard no_grad;
  for (auto& [n, t] : named_parameters())
    if (t.dtype() != dtype) replace_data(t, t.detach().to(dtype));
  for (auto& [n, t] : named_buffers())
    if (is_floating(t.dtype()) && t.dtype() != dtype) replace_data(t, t.detach().to(dtype));
}

void Module::zero_grad(bool set_to_none) {
  for (auto& [n, t] : named_parameters()) t.zero_grad(set_to_none);
}

NamedTensors Module::state_dict() const {
  NamedTensors params, buffers;
  collect("", &params, &buffers, true);
  NamedTensors all = unique_tensors(std::move(params));
  for (auto& b : unique_tensors(std::move(buffers))) all.push_back(std::move(b));
  return all;
}

void Module::load_state_dict(const NamedTensors& state, bool strict) {
  NamedTensors mine = state_dict();
  std::vector<std::pair<Tensor, Tensor>> copies;  // (destination, source), filled only after all checks
  std::set<std::string> used;
  for (const auto& [name, dst] : mine) {
    const Tensor* src = nullptr;
    for (const auto& [n, t] : state)
      if (n == name) src = &t;
    DPT_CHECK(src != nullptr, "load_state_dict: missing '{}' ({} {}) in the given state ({} entries)", name,
              shape_str(dst.shape()), dtype_name(dst.dtype()), state.size());
    DPT_CHECK(src->shape() == dst.shape(), "load_state_dict: '{}' has shape {} in the given state, expected {}", name,
              shape_str(src->shape()), shape_str(dst.shape()));
    DPT_CHECK(src->dtype() == dst.dtype(), "load_state_dict: '{}' has dtype {} in the given state, expected {}", name,
              dtype_name(src->dtype()), dtype_name(dst.dtype()));
    used.insert(name);
    copies.emplace_back(dst, *src);
  }
  if (strict) {
    for (const auto& [n, t] : state)
      DPT_CHECK(used.count(n) > 0, "load_state_dict: unexpected '{}' ({}) in the given state: the model has no such "
                "parameter or buffer", n, shape_str(t.shape()));
  }
  for (auto& [dst, src] : copies) {
    Tensor d = dst;
    d.copy_(src);
  }
}

}  // namespace dpt::nn
