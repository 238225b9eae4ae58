#pragma once
// Adam (Kingma & Ba) and AdamW (Loshchilov & Hutter), PyTorch's formulation. At step t (1-based):
//   Adam:  g = grad + wd * p                       (L2 decay folded into the gradient)
//   AdamW: p = p * (1 - lr * wd);  g = grad        (decoupled decay)
//   m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
//   p -= lr * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)
// State "exp_avg" (m) and "exp_avg_sq" (v), float32 like the (master) parameters.
#include <array>

#include "optim/optimizer.h"

namespace dpt::optim {

struct AdamOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;  // used by the single-group constructor
};

class Adam : public Optimizer {
 public:
  Adam(const NamedTensors& params, const AdamOptions& options);
  Adam(std::vector<ParamGroup> groups, const AdamOptions& options, bool decoupled_weight_decay = false);

  // For steps captured in a CUDA graph (cuda::CudaGraph): the step number and the bias corrections it
  // gives live on the device, advanced by a kernel at each begin_step(), so every replay of a captured
  // step updates as the next step, not as the captured one; step_count() then reads the device's count.
  // CUDA parameters only; the learning rate is still the host's, so keep it constant across replays. A
  // gate on the device (set_gate) turns this on: only the device knows whether a step was skipped.
  void count_steps_on_device();
  bool reads_gate_on_device() const override;  // every parameter on CUDA, and at least one
  int64_t step_count() const override;

  // Updates before the step is decided, for a trainer that does not clip: step() then reads no decision and
  // overwrites nothing that counts (optim/cuda/fused_kernels.h, AdamSpeculation), so no pass over the
  // gradients has to come before it: the update sums their squares as it reads them. resolve() then decides
  // the step and keeps the update or, for a skipped step, leaves parameters, state, twins and the step count
  // as they were. Costs a second copy of every master and moment (12 bytes a parameter). CUDA, float32
  // masters with bf16 compute twins, every parameter updated by step().
  void speculate();
  bool speculates() const { return current_.defined(); }
  // After step(): the step's outcome (optim/step_outcome.h, float64 [kStepOutcomeSize], no clipping) from
  // `agreed` (step_agreement's, summed over ranks or not) and the gradients the update read. Enqueued on the
  // device without waiting.
  Tensor resolve(const Tensor& agreed);
  void settle() const override;

 protected:
  void on_begin_step() override;
  void on_load_step() override;
  void on_set_gate() override;
  void update_group(size_t g, int64_t step) override;
  bool fuses_twins(size_t g) const override;
  bool applies_grad_scale(size_t g) const override;  // on CUDA, inside the fused kernels

 private:
  const double* device_gate() const;
  void update_group_speculatively(size_t g);
  // Pointer lists of groups [first_group, end_group)'s parameters, in order, for the speculative kernels.
  struct AllTensors;
  AllTensors tensors_of(size_t first_group, size_t end_group) const;

  AdamOptions options_;
  bool decoupled_;
  Tensor device_step_;              // int64 [1], with count_steps_on_device
  Tensor device_bias_corrections_;  // float32 [2]: 1 - beta1^t, 1 - beta2^t
  // Speculation (speculate()): second_[g][i] = the second copies of parameter i's {master, exp_avg,
  // exp_avg_sq}; current_ int32 [1], 1 when they hold the state; one partial sum of squares per chunk.
  std::vector<std::vector<std::array<Tensor, 3>>> second_;
  Tensor current_;
  Tensor partials_;
  int64_t next_partial_ = 0;  // where the next group's partial sums go
};

class AdamW : public Adam {
 public:
  AdamW(const NamedTensors& params, const AdamOptions& options);
  AdamW(std::vector<ParamGroup> groups, const AdamOptions& options);
};

}  // namespace dpt::optim
