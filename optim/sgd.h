#pragma once
// SGD with momentum, Nesterov and (L2) weight decay, PyTorch's formulation:
//   g = grad + wd * p;  buf = momentum * buf + g;  g = nesterov ? g + momentum * buf : buf;  p -= lr * g
// (no momentum: p -= lr * g). The first step's buf is g, since buf starts at zero.
#include "optim/optimizer.h"

namespace dpt::optim {

struct SgdOptions {
  double lr = 1e-2;
  double momentum = 0.0;
  bool nesterov = false;
  double weight_decay = 0.0;  // used by the single-group constructor
};

class SGD : public Optimizer {
 public:
  SGD(const NamedTensors& params, const SgdOptions& options);
  SGD(std::vector<ParamGroup> groups, const SgdOptions& options);

 protected:
  void update_group(size_t g, int64_t step) override;

 private:
  SgdOptions options_;
};

}  // namespace dpt::optim
