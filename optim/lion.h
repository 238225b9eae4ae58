#pragma once
// Lion (Chen et al. 2023, "Symbolic Discovery of Optimization Algorithms"): the update is the sign of an
// interpolation between the momentum and the gradient, so every coordinate moves by exactly lr (plus
// decay), and only one state tensor is kept. At every step:
//   c = b1 m + (1 - b1) g = lerp(g, m, b1)
//   p = p - lr (sign(c) + wd p)               (decoupled decay, as AdamW)
//   m = b2 m + (1 - b2) g = lerp(g, m, b2)
// State "exp_avg" (m), in the parameter's dtype. Written in tensor ops, so it runs wherever they do.
// Since |update| = lr per coordinate, typical learning rates are 3-10x smaller than AdamW's and weight
// decay 3-10x larger, keeping lr * wd about the same.
#include "optim/optimizer.h"

namespace dpt::optim {

struct LionOptions {
  double lr = 1e-4;
  double beta1 = 0.9;
  double beta2 = 0.99;
  double weight_decay = 0.0;  // used by the single-group constructor
};

class Lion : public Optimizer {
 public:
  Lion(const NamedTensors& params, const LionOptions& options);
  Lion(std::vector<ParamGroup> groups, const LionOptions& options);

 protected:
  void update_group(size_t g, int64_t step) override;

 private:
  LionOptions options_;
};

}  // namespace dpt::optim
