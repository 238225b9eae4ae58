#include "layers/init.h"

#include <cmath>

#include "core/error.h"

namespace dpt::nn::init {

void kaiming_uniform_(const Tensor& t, Generator& gen, int64_t fan_in, double gain) {
  DPT_CHECK(fan_in > 0, "kaiming_uniform_: fan_in must be positive, got {}", fan_in);
  double bound = gain * std::sqrt(3.0 / static_cast<double>(fan_in));
  uniform_(t, gen, -bound, bound);
}

void xavier_uniform_(const Tensor& t, Generator& gen, int64_t fan_in, int64_t fan_out, double gain) {
  DPT_CHECK(fan_in + fan_out > 0, "xavier_uniform_: fan_in + fan_out must be positive");
  double bound = gain * std::sqrt(6.0 / static_cast<double>(fan_in + fan_out));
  uniform_(t, gen, -bound, bound);
}

void fan_in_uniform_(const Tensor& t, Generator& gen, int64_t fan_in) {
  DPT_CHECK(fan_in > 0, "fan_in_uniform_: fan_in must be positive, got {}", fan_in);
  double bound = 1.0 / std::sqrt(static_cast<double>(fan_in));
  uniform_(t, gen, -bound, bound);
}

void normal_(const Tensor& t, Generator& gen, double mean, double std) { dpt::normal_(t, gen, mean, std); }

double gpt2_residual_std(int64_t n_layer) { return kGpt2Std / std::sqrt(2.0 * static_cast<double>(n_layer)); }

void zeros_(const Tensor& t) {
  Tensor x = t;
  x.zero_();
}

}  // namespace dpt::nn::init
