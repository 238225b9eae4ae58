#pragma once
// Optimizer base: parameter groups, the step counter, per-parameter state tensors and their
// checkpointing. Subclasses implement update(); on CUDA they update all parameters of a group in a
// few fused launches (optim/cuda/), on the CPU with plain loops.
#include <string>
#include <vector>

#include "core/safetensors.h"
#include "core/tensor.h"

namespace dpt::optim {

struct ParamGroup {
  NamedTensors params;        // names make the optimizer state readable and checkable on load
  double weight_decay = 0.0;
  double lr_scale = 1.0;      // this group's lr = optimizer lr * lr_scale
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

  double lr() const { return lr_; }
  void set_lr(double lr) { lr_ = lr; }
  int64_t step_count() const { return step_; }  // updates done so far
  const std::vector<ParamGroup>& param_groups() const { return groups_; }

  // Everything needed to resume: "step" (int64 scalar) and "<state>.<param name>" for each state tensor.
  NamedTensors state_dict() const;
  // Checks names, shapes and dtypes before copying anything; errors name the first mismatch.
  void load_state_dict(const NamedTensors& state);

 protected:
  // Update group `g` for step number `step` (1-based, as bias correction wants it).
  virtual void update_group(size_t g, int64_t step) = 0;
  // state_[g][i][s]: state s of parameter i in group g.
  std::vector<std::vector<std::vector<Tensor>>> state_;

 private:
  std::vector<ParamGroup> groups_;
  double lr_;
  int64_t step_ = 0;
  std::vector<std::string> state_names_;
};

}  // namespace dpt::optim
