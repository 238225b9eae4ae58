#pragma once
// Learning-rate schedules: a pure function of the step number, so resuming from a checkpoint needs
// only the step. Steps count optimizer updates from 0.
#include <cstdint>
#include <memory>
#include <string>

namespace dpt::optim {

class LrSchedule {
 public:
  virtual ~LrSchedule() = default;
  virtual double lr(int64_t step) const = 0;
};

// lr(step) = base.
class ConstantLr : public LrSchedule {
 public:
  explicit ConstantLr(double base) : base_(base) {}
  double lr(int64_t) const override { return base_; }

 private:
  double base_;
};

// lr(step) = base * gamma^(step / step_size): multiplied by gamma every step_size steps.
class StepLr : public LrSchedule {
 public:
  StepLr(double base, int64_t step_size, double gamma);
  double lr(int64_t step) const override;

 private:
  double base_;
  int64_t step_size_;
  double gamma_;
};

// Linear warmup from base/warmup to base over `warmup_steps` (step 0 already trains), then a half
// cosine from base at step == warmup_steps down to `min_lr` at step == total_steps, and min_lr after.
class WarmupCosineLr : public LrSchedule {
 public:
  WarmupCosineLr(double base, int64_t warmup_steps, int64_t total_steps, double min_lr);
  double lr(int64_t step) const override;

 private:
  double base_;
  int64_t warmup_;
  int64_t total_;
  double min_lr_;
};

// From a config: kind "constant", "step" or "cosine" (warmup + cosine). Unknown kinds throw.
struct LrScheduleConfig {
  std::string kind = "constant";
  double lr = 1e-3;
  int64_t warmup_steps = 0;
  int64_t total_steps = 0;  // cosine: where the decay reaches min_lr
  double min_lr = 0;
  int64_t step_size = 1;    // step: decay period
  double gamma = 0.1;       // step: decay factor
};
std::unique_ptr<LrSchedule> make_lr_schedule(const LrScheduleConfig& config);

}  // namespace dpt::optim
