#pragma once
// Kernels behind dpt::layer_norm (core/ops_norm.h), one set per backend. x, y, gy, gx: [rows, n] in the
// input dtype; weight/bias/gw/gb: [n] in the parameter dtype; mean/rstd: [rows] float32 (float64 for
// float64 input). grad_add, when defined ([rows, n] in the input dtype), is added to grad_x before its one
// rounding: the gradient of a skip connection that leaves from the same input (dpt::layer_norm_and_skip).
#include <cstdint>

#include "core/tensor.h"

#define DPT_NORM_KERNELS                                                                                  \
  void layer_norm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& y,     \
                          const Tensor& mean, const Tensor& rstd, int64_t rows, int64_t n, double eps);   \
  void layer_norm_backward(const Tensor& grad_y, const Tensor& x, const Tensor& weight, const Tensor& mean, \
                           const Tensor& rstd, const Tensor& grad_x, const Tensor& grad_weight,           \
                           const Tensor& grad_bias, int64_t rows, int64_t n, const Tensor& grad_add);

namespace dpt::cpu {
DPT_NORM_KERNELS
}
namespace dpt::cuda_kernels {
DPT_NORM_KERNELS
}
#undef DPT_NORM_KERNELS
