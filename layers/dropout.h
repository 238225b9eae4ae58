#pragma once
// Dropout: in training, zeroes each element with probability p and scales the survivors by 1/(1-p);
// identity in eval mode or when p == 0. The mask comes from the counter-based generator (uniform
// u_i in (0, 1], kept when u_i > p) inside one kernel (dpt::dropout): the same seed and offset give
// the same mask on CPU and GPU.
#include "layers/module.h"

namespace dpt::nn {

class Dropout : public Module {
 public:
  explicit Dropout(double p, Generator& gen = default_generator());
  Tensor forward(const Tensor& x) override;
  double p() const { return p_; }

 private:
  double p_;
  Generator* gen_;
};

// The functional form: `training` false or p == 0 returns x unchanged.
Tensor dropout(const Tensor& x, double p, bool training, Generator& gen);

}  // namespace dpt::nn
