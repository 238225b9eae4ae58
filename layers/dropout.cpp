#include "layers/dropout.h"

#include "core/error.h"
#include "core/ops.h"

namespace dpt::nn {

Tensor dropout(const Tensor& x, double p, bool training, Generator& gen) {
  DPT_CHECK(p >= 0 && p < 1, "dropout: p must be in [0, 1), got {}", p);
  if (!training || p == 0) return x;
  return dpt::dropout(x, p, gen);
}

Dropout::Dropout(double p, Generator& gen) : p_(p), gen_(&gen) {
  DPT_CHECK(p >= 0 && p < 1, "Dropout: p must be in [0, 1), got {}", p);
}

Tensor Dropout::forward(const Tensor& x) { return dropout(x, p_, is_training(), *gen_); }

}  // namespace dpt::nn
