#include "optim/lr_schedule.h"

#include <cmath>
#include <numbers>

#include "core/error.h"

namespace dpt::optim {

StepLr::StepLr(double base, int64_t step_size, double gamma) : base_(base), step_size_(step_size), gamma_(gamma) {
  DPT_CHECK(step_size > 0, "StepLr: step_size must be positive, got {}", step_size);
}

double StepLr::lr(int64_t step) const {
  return base_ * std::pow(gamma_, static_cast<double>(std::max<int64_t>(step, 0) / step_size_));
}

WarmupCosineLr::WarmupCosineLr(double base, int64_t warmup_steps, int64_t total_steps, double min_lr)
    : base_(base), warmup_(warmup_steps), total_(total_steps), min_lr_(min_lr) {
  DPT_CHECK(warmup_steps >= 0 && total_steps >= warmup_steps,
            "WarmupCosineLr: need 0 <= warmup_steps <= total_steps, got warmup {} total {}", warmup_steps,
            total_steps);
  DPT_CHECK(min_lr <= base, "WarmupCosineLr: min_lr {} exceeds the base lr {}", min_lr, base);
}

double WarmupCosineLr::lr(int64_t step) const {
  if (step < warmup_) return base_ * static_cast<double>(step + 1) / static_cast<double>(warmup_);
  if (step >= total_) return min_lr_;
  // progress 0 -> 1 over the decay; cosine factor 1 -> 0.
  double progress = static_cast<double>(step - warmup_) / static_cast<double>(total_ - warmup_);
  return min_lr_ + 0.5 * (base_ - min_lr_) * (1.0 + std::cos(std::numbers::pi * progress));
}

std::unique_ptr<LrSchedule> make_lr_schedule(const LrScheduleConfig& c) {
  if (c.kind == "constant") return std::make_unique<ConstantLr>(c.lr);
  if (c.kind == "step") return std::make_unique<StepLr>(c.lr, c.step_size, c.gamma);
  if (c.kind == "cosine") return std::make_unique<WarmupCosineLr>(c.lr, c.warmup_steps, c.total_steps, c.min_lr);
  DPT_FAIL("unknown learning-rate schedule '{}' (expected constant, step or cosine)", c.kind);
}

}  // namespace dpt::optim
