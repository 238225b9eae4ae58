#pragma once
// Seeded parameter initializers (in place, no autograd). All draw from a dpt::Generator, so the same
// seed gives the same model on every rank and on CPU or GPU.
#include "core/factory.h"
#include "core/tensor.h"

namespace dpt::nn::init {

// U(-b, b) with b = gain * sqrt(3 / fan_in): variance gain^2 / fan_in (He et al. 2015; gain sqrt(2) for ReLU).
void kaiming_uniform_(const Tensor& t, Generator& gen, int64_t fan_in, double gain = 1.4142135623730951);
// U(-b, b) with b = gain * sqrt(6 / (fan_in + fan_out)) (Glorot & Bengio 2010).
void xavier_uniform_(const Tensor& t, Generator& gen, int64_t fan_in, int64_t fan_out, double gain = 1.0);
// U(-1/sqrt(fan_in), 1/sqrt(fan_in)): PyTorch's default for Linear and Conv weights and biases.
void fan_in_uniform_(const Tensor& t, Generator& gen, int64_t fan_in);
// N(mean, std^2).
void normal_(const Tensor& t, Generator& gen, double mean, double std);
// GPT-2: N(0, 0.02^2), and for projections that write into the residual stream N(0, (0.02/sqrt(2 L))^2),
// so the residual's variance does not grow with the number of layers L.
inline constexpr double kGpt2Std = 0.02;
double gpt2_residual_std(int64_t n_layer);
void zeros_(const Tensor& t);

}  // namespace dpt::nn::init
