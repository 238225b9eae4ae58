#pragma once
// Kernels behind dpt::causal_attention and dpt::causal_attention_qkv (core/ops_flash_attention.h), one set
// per backend. lse: contiguous [bh, t] in float32 (float64 for float64 input), natural-log units. The
// backward overwrites grad_q/k/v.
//   flash_attention_forward/backward: q, k, v, out, grad_out, grad_q, grad_k, grad_v contiguous [bh, t, d]
//   in one dtype.
//   flash_attention_*_strided: each of those tensors is a buffer holding its [bh, t, d] operand where
//   `layouts` says (core/attention_layout.h; a gradient has its operand's layout), e.g. q, k and v all
//   the one packed [B, T, 3C] tensor. The CPU runs every floating dtype; CUDA (contiguous or strided) runs
//   only the cases flash_attention_strided_supported accepts, on the mma.sync kernels.
//   grad_sums (backward_strided), when defined: grad_q, grad_k and grad_v are the parts of one packed
//   [B, T, 3C] buffer (AttentionLayouts::packed_qkv, C = layouts.q.heads d) and grad_sums, [3C] in float32
//   or the gradient's dtype, receives the column sums of that buffer as written: the QKV projection's
//   bias gradient (core/grad_column_sums.h), formed on the way instead of by a pass over the buffer.
//   dropout (strided, CUDA only): dropout on the attention weights (core/attention_layout.h); the forward
//   and the backward of one call take the same one.
#include <cstdint>

#include "core/attention_layout.h"
#include "core/tensor.h"

#define DPT_FLASH_ATTENTION_KERNELS                                                                                    \
  void flash_attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,                   \
                               const Tensor& lse, int64_t bh, int64_t t, int64_t d, double scale);                     \
  void flash_attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,                  \
                                const Tensor& grad_out, const Tensor& lse, const Tensor& grad_q, const Tensor& grad_k, \
                                const Tensor& grad_v, int64_t bh, int64_t t, int64_t d, double scale);                 \
  void flash_attention_forward_strided(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,           \
                                       const Tensor& lse, const AttentionLayouts& layouts, int64_t bh, int64_t t,      \
                                       int64_t d, double scale, const AttentionDropout& dropout = {});                 \
  void flash_attention_backward_strided(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,          \
                                        const Tensor& grad_out, const Tensor& lse, const Tensor& grad_q,               \
                                        const Tensor& grad_k, const Tensor& grad_v, const AttentionLayouts& layouts,   \
                                        int64_t bh, int64_t t, int64_t d, double scale, const Tensor& grad_sums,       \
                                        const AttentionDropout& dropout = {});

namespace dpt::cpu {
DPT_FLASH_ATTENTION_KERNELS
}
namespace dpt::cuda_kernels {
DPT_FLASH_ATTENTION_KERNELS

// True when the CUDA kernels can run a call with these q, k, v and out buffers: bfloat16, a head size the
// mma.sync kernels are built for (32, 64, 128), a positive scale, and every operand row starting 16-byte
// aligned (the tile loads are 16-byte cp.async vectors). The gradients of a backward must then be aligned
// too; fresh allocations always are.
bool flash_attention_strided_supported(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                                       const AttentionLayouts& layouts, int64_t d, double scale);
}  // namespace dpt::cuda_kernels
#undef DPT_FLASH_ATTENTION_KERNELS
