#pragma once
// Dynamic loss scaling for float16 training (Micikevicius et al. 2018), with the semantics of PyTorch's
// torch.amp.GradScaler. float16 has 5 exponent bits: gradients below 2^-24 flush to zero and above
// 65504 overflow to inf. Multiplying the loss by a scale S before backward shifts every gradient by S
// (the chain rule is linear in the upstream gradient), so small gradients stay representable; the
// float32 master gradients are divided by S again before clipping and the optimizer, which therefore
// see the true gradients. S is chosen dynamically:
//   - a step whose gradients hold any inf or NaN is skipped (parameters, optimizer state and the
//     optimizer's step counter untouched) and S *= backoff_factor (0.5);
//   - after growth_interval (2000) consecutive finite steps, S *= growth_factor (2).
// The start, 2^16, is deliberately too large: the first steps overflow and back off to a scale that
// fits this model, after which growth probes upwards again every growth_interval steps.
//
// The inf/NaN check costs no host sync per tensor: unscale_into() ORs "any non-finite" into a flag on
// the gradients' device in the same pass that writes the float32 gradient, and found_inf() reads it
// once per step.
//
// Under DDP the gradients are AllReduced before they reach the scaler, and an inf or NaN on any rank
// makes the reduced sum inf/NaN on every rank, so every rank finds the same flag and skips (and backs
// off) together; scales never diverge across ranks.
#include <cstdint>

#include "core/tensor.h"

namespace dpt::optim {

struct LossScalerOptions {
  double init_scale = 65536.0;  // 2^16
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int64_t growth_interval = 2000;  // consecutive finite steps before the scale grows
};

class LossScaler {
 public:
  explicit LossScaler(const LossScalerOptions& options = {});

  double scale() const { return scale_; }
  int64_t growth_tracker() const { return growth_tracker_; }  // finite steps since the last change
  const LossScalerOptions& options() const { return options_; }

  // loss * scale() in float32 (float64 for a float64 loss): call backward on this instead of on the loss.
  Tensor scale_loss(const Tensor& loss) const;

  // master_grad = float32(grad) / scale(), both contiguous and of one shape on one device; remembers on
  // that device whether any result is inf or NaN. No host sync.
  void unscale_into(const Tensor& grad, const Tensor& master_grad);

  // True when any gradient given to unscale_into() since the last call was inf or NaN: one read of the
  // device flag, which is then cleared.
  bool found_inf();

  // Ends a step: backs off (and restarts the growth count) when `found_inf`, otherwise counts the
  // finite step and grows the scale every growth_interval of them.
  void update(bool found_inf);

  // Restores scale and growth count (from a checkpoint).
  void load(double scale, int64_t growth_tracker);

 private:
  LossScalerOptions options_;
  double scale_;
  int64_t growth_tracker_ = 0;
  Tensor found_inf_;  // int32 [1] on the gradients' device, 0 or 1; created by the first unscale_into
};

}  // namespace dpt::optim
