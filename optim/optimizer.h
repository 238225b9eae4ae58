#pragma once
// Optimizer base: parameter groups, the step counter, per-parameter state tensors and their
// checkpointing. Subclasses implement update(); on CUDA they update all parameters of a group in a
// few fused launches (optim/cuda/), on the CPU with plain loops.
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/safetensors.h"
#include "core/tensor.h"

namespace dpt::optim {

struct ParamGroup {
  NamedTensors params;  // names make the optimizer state readable and checkable on load
  double weight_decay = 0.0;
  double lr_scale = 1.0;  // this group's lr = optimizer lr * lr_scale
};

// Two groups in the GPT-2 recipe: tensors of rank >= 2 (matmul weights, embeddings) decay, the rest
// (biases, LayerNorm weights) do not. Either group is omitted when empty.
std::vector<ParamGroup> weight_decay_groups(const NamedTensors& params, double weight_decay);

class Optimizer {
 public:
  // `state_names`: per-parameter state this optimizer keeps (e.g. {"exp_avg", "exp_avg_sq"}), allocated
  // up front as zeros like each parameter.
  Optimizer(std::vector<ParamGroup> groups, double lr, std::vector<std::string> state_names);
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  // One update of every parameter that has a gradient; parameters without one are left alone.
  void step();
  void zero_grad(bool set_to_none = false);

  // Overlapped stepping, e.g. one gradient bucket at a time as DDP finishes them
  // (distributed/updating_exchange.h): begin_step() once, then update(params) for disjoint subsets; together they
  // do what one step() does. `params` may name the optimizer's parameters or their compute twins. Under a
  // gate, take_gate() first: false means no begin_step() and no update this step.
  void begin_step();
  void update(const std::vector<Tensor>& params);
  // A gate read on the host: false when it skips the step, else its scale becomes grad_scale(). True
  // without a gate, or when the kernels read it on the device (they skip and scale there).
  bool take_gate();

  // bf16 mixed precision without float32 gradient copies (optim/mixed_precision.h): `twins` are the
  // model's compute-dtype parameters, one per optimizer parameter, with the same names. Each update
  // then reads parameter i's gradient from twins[i].grad() and writes the new value, rounded, into
  // twins[i]: on CUDA inside the fused update (Adam), elsewhere through a float32 staging copy. The
  // float32 parameters (masters) then need no gradients of their own.
  void set_compute_twins(const NamedTensors& twins);
  bool has_compute_twins() const { return !twins_.empty(); }

  double lr() const { return lr_; }
  void set_lr(double lr) { lr_ = lr; }
  // The factor every gradient is multiplied by as the updates read it, until set again (1: none). How a
  // trainer clips gradients it cannot scale in place (the bf16 gradients of compute twins); in float32
  // the product rounds as an in-place scaling of the gradient would.
  void set_grad_scale(double scale) { grad_scale_ = scale; }
  double grad_scale() const { return grad_scale_; }
  // A step decided on the device (optim/step_outcome.h): `gate` is float64 [2] = {skip, gradient scale},
  // read when each step() runs, until cleared with an undefined tensor. A nonzero skip leaves parameters,
  // state and the step count untouched; otherwise the scale is the step's grad_scale(). Optimizers whose
  // kernels read it on the device (reads_gate_on_device) never wait for it; the others read it on the host.
  void set_gate(Tensor gate);
  virtual bool reads_gate_on_device() const { return false; }
  // Updates done so far (with the step counted on the device, read from there).
  virtual int64_t step_count() const { return step_; }
  const std::vector<ParamGroup>& param_groups() const { return groups_; }

  // Makes the parameters and state tensors hold the current values, which an optimizer may keep elsewhere
  // between steps (Adam::speculate); state_dict() calls it. Call it before reading the parameters.
  virtual void settle() const {}
  // Everything needed to resume: "step" (int64 scalar) and "<state>.<param name>" for each state tensor.
  NamedTensors state_dict() const;
  const std::vector<std::string>& state_names() const { return state_names_; }  // the <state> parts
  // Checks names, shapes and dtypes before copying anything; errors name the first mismatch.
  void load_state_dict(const NamedTensors& state);

 protected:
  // Called by begin_step() once the host step counter has advanced.
  virtual void on_begin_step() {}
  // Called by load_state_dict() once the host step counter is the loaded one, and by set_gate().
  virtual void on_load_step() {}
  virtual void on_set_gate() {}
  const Tensor& gate() const { return gate_; }
  // Update group `g` for step number `step` (1-based, as bias correction wants it): every parameter i
  // with selected(g, i) and a gradient.
  virtual void update_group(size_t g, int64_t step) = 0;
  // Whether this subclass reads twin gradients and writes twins itself for group g (Adam on CUDA);
  // otherwise the base stages float32 gradients from the twins and copies the results back.
  virtual bool fuses_twins(size_t /*g*/) const { return false; }
  // Whether this subclass multiplies group g's gradients by grad_scale() itself as it reads them (Adam on
  // CUDA); otherwise the base scales the float32 gradients (staged ones under twins) before update_group.
  virtual bool applies_grad_scale(size_t /*g*/) const { return false; }
  bool selected(size_t g, size_t i) const { return selected_.empty() || selected_[g][i] != 0; }
  // Parameter i of group g's compute twin (undefined without twins).
  Tensor twin(size_t g, size_t i) const { return twins_.empty() ? Tensor() : twins_[g][i]; }
  // state_[g][i][s]: state s of parameter i in group g.
  std::vector<std::vector<std::vector<Tensor>>> state_;

 private:
  void run_updates();
  void scale_grads(size_t g);  // group g's (float32 or staged) gradients *= grad_scale_, in place

  std::vector<ParamGroup> groups_;
  double lr_;
  double grad_scale_ = 1.0;
  Tensor gate_;
  int64_t step_ = 0;
  std::vector<std::string> state_names_;
  std::vector<std::vector<Tensor>> twins_;                                  // [g][i], or empty
  std::unordered_map<const TensorImpl*, std::pair<size_t, size_t>> index_;  // parameter or twin -> (g, i)
  std::vector<std::vector<char>> selected_;                                 // empty: every parameter
};

}  // namespace dpt::optim
