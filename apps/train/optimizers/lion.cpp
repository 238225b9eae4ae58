// optim.kind lion (optim/lion.h): optim.lr and optim.weight_decay as for every optimizer, its own betas.
#include "optim/lion.h"

#include "components.h"

namespace dpt::train {
namespace {

std::unique_ptr<optim::Optimizer> make_lion(const Config& config, const Settings& s,
                                            std::vector<optim::ParamGroup> groups) {
  optim::LionOptions o;
  o.lr = config.optim.lr;
  o.beta1 = s.number("beta1");
  o.beta2 = s.number("beta2");
  return std::make_unique<optim::Lion>(std::move(groups), o);
}

}  // namespace
}  // namespace dpt::train

DPT_REGISTER(dpt::train::optimizers,
             {"lion",
              "Lion: sign of an interpolated momentum; use about 1/3-1/10 of AdamW's lr and 3-10x its weight decay",
              {{.name = "beta1",
                .type = dpt::SettingSpec::Type::Float,
                .default_value = "0.9",
                .min = 0,
                .max = 1,
                .help = "lion: weight of the momentum in the update direction"},
               {.name = "beta2",
                .type = dpt::SettingSpec::Type::Float,
                .default_value = "0.99",
                .min = 0,
                .max = 1,
                .help = "lion: decay of the momentum"}},
              dpt::train::make_lion})
