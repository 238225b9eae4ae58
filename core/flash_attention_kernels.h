#pragma once
// Kernels behind dpt::causal_attention (core/ops_flash_attention.h), one set per backend. q, k, v, out,
// grad_out, grad_q, grad_k, grad_v: contiguous [bh, t, d] in one dtype; lse: contiguous [bh, t] in
// float32 (float64 for float64 input), natural-log units. The backward overwrites grad_q/k/v.
#include <cstdint>

#include "core/tensor.h"

#define DPT_FLASH_ATTENTION_KERNELS                                                                                    \
  void flash_attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,                   \
                               const Tensor& lse, int64_t bh, int64_t t, int64_t d, double scale);                     \
  void flash_attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,                  \
                                const Tensor& grad_out, const Tensor& lse, const Tensor& grad_q, const Tensor& grad_k, \
                                const Tensor& grad_v, int64_t bh, int64_t t, int64_t d, double scale);

namespace dpt::cpu {
DPT_FLASH_ATTENTION_KERNELS
}
namespace dpt::cuda_kernels {
DPT_FLASH_ATTENTION_KERNELS
}
#undef DPT_FLASH_ATTENTION_KERNELS
