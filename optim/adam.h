#pragma once
// Adam (Kingma & Ba) and AdamW (Loshchilov & Hutter), PyTorch's formulation. At step t (1-based):
//   Adam:  g = grad + wd * p                       (L2 decay folded into the gradient)
//   AdamW: p = p * (1 - lr * wd);  g = grad        (decoupled decay)
//   m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
//   p -= lr * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)
// State "exp_avg" (m) and "exp_avg_sq" (v), float32 like the (master) parameters.
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

 protected:
  void on_begin_step() override;
  void on_load_step() override;
  void on_set_gate() override;
  void update_group(size_t g, int64_t step) override;
  bool fuses_twins(size_t g) const override;
  bool applies_grad_scale(size_t g) const override;  // on CUDA, inside the fused kernels

 private:
  const double* device_gate() const;

  AdamOptions options_;
  bool decoupled_;
  Tensor device_step_;              // int64 [1], with count_steps_on_device
  Tensor device_bias_corrections_;  // float32 [2]: 1 - beta1^t, 1 - beta2^t
};

class AdamW : public Adam {
 public:
  AdamW(const NamedTensors& params, const AdamOptions& options);
  AdamW(std::vector<ParamGroup> groups, const AdamOptions& options);
};

}  // namespace dpt::optim
