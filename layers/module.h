#pragma once
// Module: the base of every layer and model. It owns named parameters (leaf tensors that require
// grad), buffers (state that is not trained, e.g. a causal mask) and child modules, and gives every
// tensor a dotted path: "blocks.3.attn.qkv.weight".
//
// Order is part of the contract: named_parameters() lists a module's own parameters in registration
// order, then each child's, depth first, in the order the children were registered. DDP builds its
// buckets from this order on every rank, so it must not depend on hashing or addresses.
//
// Parameters keep their identity for the module's lifetime: to(device) / to(dtype) swap the data
// underneath the same tensor handle (like `param.data = ...` in PyTorch), so handles held by layers,
// optimizers or DDP stay valid.
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/factory.h"
#include "core/safetensors.h"
#include "core/tensor.h"

namespace dpt::nn {

class Module {
 public:
  Module() = default;
  virtual ~Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  // The single-input forward that Sequential chains; modules with other signatures throw here.
  virtual Tensor forward(const Tensor& input);
  Tensor operator()(const Tensor& input) { return forward(input); }

  // --- tree -------------------------------------------------------------------------------------
  NamedTensors named_parameters() const;  // registration order, depth first; shared tensors once
  std::vector<Tensor> parameters() const;
  NamedTensors named_buffers() const;     // all buffers, persistent or not
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> named_children() const { return children_; }
  int64_t num_parameters() const;         // elements, counting shared tensors once

  // --- mode, placement ----------------------------------------------------------------------------
  virtual void train(bool on = true);     // recursive
  void eval() { train(false); }
  bool is_training() const { return training_; }
  void to(Device device);                 // parameters and buffers; gradients are dropped
  void to(DType dtype);                   // floating parameters and buffers only
  void zero_grad(bool set_to_none = false);

  // --- state ---------------------------------------------------------------------------------------
  // Parameters then persistent buffers, by path. Tensors alias the module's (no copy).
  NamedTensors state_dict() const;
  // Copies values in (any device; dtypes must match exactly). Checks everything before copying
  // anything: a missing name, an unexpected name (when strict), a shape or a dtype mismatch throws an
  // error naming the first offender with what was expected and found.
  void load_state_dict(const NamedTensors& state, bool strict = true);

 protected:
  // Registers `value` as a parameter (made a leaf that requires grad) and returns the same handle.
  Tensor register_parameter(const std::string& name, Tensor value);
  // Registers a tensor that is saved (when persistent) and moved with the module but not trained.
  Tensor register_buffer(const std::string& name, Tensor value, bool persistent = true);
  template <class M>
  std::shared_ptr<M> register_module(const std::string& name, std::shared_ptr<M> module) {
    add_child(name, module);
    return module;
  }

 private:
  struct Buffer {
    std::string name;
    Tensor tensor;
    bool persistent;
  };
  void add_child(const std::string& name, std::shared_ptr<Module> module);
  void check_new_name(const std::string& name) const;
  void collect(const std::string& prefix, NamedTensors* params, NamedTensors* buffers, bool persistent_only) const;

  NamedTensors params_;
  std::vector<Buffer> buffers_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
  bool training_ = true;
};

// Replaces the data under `param` with `value`'s (same handle, new storage/shape/dtype/device) and
// drops its gradient. Used by Module::to and by mixed precision.
void replace_data(const Tensor& param, const Tensor& value);

}  // namespace dpt::nn
