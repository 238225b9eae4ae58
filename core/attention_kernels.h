#pragma once
// Kernels behind dpt::causal_softmax (core/ops_attention.h): x, y, gy, gx contiguous [rows, t].
#include <cstdint>

#include "core/tensor.h"

#define DPT_ATTENTION_KERNELS                                                                              \
  void causal_softmax_forward(const Tensor& x, const Tensor& y, int64_t rows, int64_t t, double scale);    \
  void causal_softmax_backward(const Tensor& grad_y, const Tensor& y, const Tensor& grad_x, int64_t rows, \
                               int64_t t, double scale);

namespace dpt::cpu {
DPT_ATTENTION_KERNELS
}
namespace dpt::cuda_kernels {
DPT_ATTENTION_KERNELS
}
#undef DPT_ATTENTION_KERNELS
