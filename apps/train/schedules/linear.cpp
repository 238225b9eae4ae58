// schedule.kind linear: linear warmup as the cosine schedule's (from lr/warmup at step 0 to lr at step
// warmup), then a straight line down to final_fraction * lr at the last step, and that value after.
#include <algorithm>

#include "components.h"
#include "core/error.h"

namespace dpt::train {
namespace {

class WarmupLinearLr : public optim::LrSchedule {
 public:
  WarmupLinearLr(double base, int64_t warmup, int64_t total, double final_lr)
      : base_(base), warmup_(warmup), total_(total), final_(final_lr) {}
  double lr(int64_t step) const override {
    if (step < warmup_) return base_ * static_cast<double>(step + 1) / static_cast<double>(warmup_);
    if (step >= total_) return final_;
    const double progress = static_cast<double>(step - warmup_) / static_cast<double>(total_ - warmup_);
    return base_ + (final_ - base_) * progress;
  }

 private:
  double base_;
  int64_t warmup_, total_;
  double final_;
};

std::unique_ptr<optim::LrSchedule> make_linear(const Config& c, const Settings& s, int64_t total_steps) {
  const int64_t warmup = s.integer("warmup_steps");
  DPT_CHECK(warmup < total_steps, "schedule.linear.warmup_steps: must be below the run's {} steps, got {}", total_steps,
            warmup);
  return std::make_unique<WarmupLinearLr>(c.optim.lr, warmup, total_steps, c.optim.lr * s.number("final_fraction"));
}

}  // namespace
}  // namespace dpt::train

DPT_REGISTER(dpt::train::schedules, {"linear",
                                     "linear warmup, then a linear decay to final_fraction * optim.lr at the last step",
                                     {{.name = "warmup_steps",
                                       .type = dpt::SettingSpec::Type::Int,
                                       .default_value = "0",
                                       .min = 0,
                                       .help = "linear: steps of linear warmup"},
                                      {.name = "final_fraction",
                                       .type = dpt::SettingSpec::Type::Float,
                                       .default_value = "0",
                                       .min = 0,
                                       .max = 1,
                                       .help = "linear: the last step's learning rate as a fraction of optim.lr"}},
                                     dpt::train::make_linear})
