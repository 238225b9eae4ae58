// The built-in schedules (optim/lr_schedule.h). They predate the registry and read the flat keys
// schedule.warmup_steps, schedule.min_lr (cosine), schedule.step_size and schedule.gamma (step).
#include "components.h"

namespace dpt::train {
namespace {

std::unique_ptr<optim::LrSchedule> make_builtin(const Config& c, const Settings&, int64_t total_steps) {
  optim::LrScheduleConfig sc;
  sc.kind = c.schedule.kind;
  sc.lr = c.optim.lr;
  sc.warmup_steps = c.schedule.warmup_steps;
  sc.total_steps = total_steps;
  sc.min_lr = c.schedule.min_lr;
  sc.step_size = c.schedule.step_size;
  sc.gamma = c.schedule.gamma;
  return optim::make_lr_schedule(sc);
}

}  // namespace
}  // namespace dpt::train

DPT_REGISTER(dpt::train::schedules, {"constant", "optim.lr at every step", {}, dpt::train::make_builtin})
DPT_REGISTER(dpt::train::schedules,
             {"cosine", "linear warmup, then a half cosine to schedule.min_lr", {}, dpt::train::make_builtin})
DPT_REGISTER(dpt::train::schedules,
             {"step", "optim.lr times schedule.gamma every schedule.step_size steps", {}, dpt::train::make_builtin})
