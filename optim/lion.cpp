#include "optim/lion.h"

#include "core/autograd.h"
#include "core/error.h"
#include "core/ops.h"

namespace dpt::optim {

Lion::Lion(const NamedTensors& params, const LionOptions& options)
    : Lion(std::vector<ParamGroup>{ParamGroup{params, options.weight_decay, 1.0}}, options) {}

Lion::Lion(std::vector<ParamGroup> groups, const LionOptions& options)
    : Optimizer(std::move(groups), options.lr, {"exp_avg"}), options_(options) {
  DPT_CHECK(options.beta1 >= 0 && options.beta1 <= 1 && options.beta2 >= 0 && options.beta2 <= 1,
            "Lion: betas must be in [0, 1], got ({}, {})", options.beta1, options.beta2);
}

void Lion::update_group(size_t g, int64_t) {
  NoGradGuard no_grad;
  const ParamGroup& group = param_groups()[g];
  const double lr = this->lr() * group.lr_scale;
  for (size_t i = 0; i < group.params.size(); ++i) {
    if (!selected(g, i)) continue;
    const auto& [name, p] = group.params[i];
    Tensor grad = p.grad();
    if (!grad.defined()) continue;
    DPT_CHECK(grad.dtype() == p.dtype(), "Lion: parameter '{}' is {} but its gradient is {}", name,
              dtype_name(p.dtype()), dtype_name(grad.dtype()));
    Tensor& m = state_[g][i][0];
    // The direction uses the old momentum; the momentum then moves with its own (slower) beta2.
    Tensor direction = sign(lerp(grad, m, options_.beta1));
    Tensor decayed = group.weight_decay != 0 ? mul(p, 1.0 - lr * group.weight_decay) : p;
    Tensor updated = sub(decayed, mul(direction, lr));
    m.copy_(lerp(grad, m, options_.beta2));
    Tensor param = p;  // a handle to the same storage: the update lands in the parameter itself
    param.copy_(updated);
  }
}

}  // namespace dpt::optim
