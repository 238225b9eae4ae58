// The built-in optimizers. They predate the registry and read the flat keys optim.beta1, optim.beta2,
// optim.eps (Adam, AdamW), optim.momentum and optim.nesterov (SGD), so they register no settings.
#include "components.h"
#include "optim/adam.h"
#include "optim/sgd.h"

namespace dpt::train {
namespace {

optim::AdamOptions adam_options(const OptimConfig& o) {
  optim::AdamOptions ao;
  ao.lr = o.lr;
  ao.beta1 = o.beta1;
  ao.beta2 = o.beta2;
  ao.eps = o.eps;
  ao.weight_decay = o.weight_decay;
  return ao;
}

std::unique_ptr<optim::Optimizer> make_adamw(const Config& c, const Settings&, std::vector<optim::ParamGroup> groups) {
  return std::make_unique<optim::AdamW>(std::move(groups), adam_options(c.optim));
}

std::unique_ptr<optim::Optimizer> make_adam(const Config& c, const Settings&, std::vector<optim::ParamGroup> groups) {
  return std::make_unique<optim::Adam>(std::move(groups), adam_options(c.optim), /*decoupled_weight_decay=*/false);
}

std::unique_ptr<optim::Optimizer> make_sgd(const Config& c, const Settings&, std::vector<optim::ParamGroup> groups) {
  optim::SgdOptions so;
  so.lr = c.optim.lr;
  so.momentum = c.optim.momentum;
  so.nesterov = c.optim.nesterov;
  so.weight_decay = c.optim.weight_decay;
  return std::make_unique<optim::SGD>(std::move(groups), so);
}

}  // namespace
}  // namespace dpt::train

DPT_REGISTER(dpt::train::optimizers, {"adamw", "AdamW (decoupled weight decay)", {}, dpt::train::make_adamw})
DPT_REGISTER(dpt::train::optimizers, {"adam", "Adam (L2 weight decay in the gradient)", {}, dpt::train::make_adam})
DPT_REGISTER(dpt::train::optimizers, {"sgd", "SGD with optional (Nesterov) momentum", {}, dpt::train::make_sgd})
