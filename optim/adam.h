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

 protected:
  void update_group(size_t g, int64_t step) override;
  bool fuses_twins(size_t g) const override;

 private:
  AdamOptions options_;
  bool decoupled_;
};

class AdamW : public Adam {
 public:
  AdamW(const NamedTensors& params, const AdamOptions& options);
  AdamW(std::vector<ParamGroup> groups, const AdamOptions& options);
};

}  // namespace dpt::optim
