#pragma once
// bfloat16 fused causal attention on mma.sync tensor-core instructions (core/cuda/flash_attention_mma.cu),
// called by the entry points in core/cuda/flash_attention.cu. Each operand pointer is a buffer holding its
// [bh, t, d] operand at the place `layouts` gives (core/attention_layout.h; a gradient has its operand's
// layout), contiguous or, e.g., the heads of a packed [B, T, 3C] QKV projection. lse is contiguous
// [bh, t], float32, natural log. Every operand row must start 16-byte aligned (flash_mma_operands_aligned).
#include <cuda_runtime.h>

#include <cstdint>
#include <initializer_list>
#include <utility>

#include "core/attention_layout.h"
#include "core/cuda/kernel_utils.cuh"

namespace dpt::cuda_kernels {

// True for the head sizes the mma kernels are built for, with a positive scale (folded into the
// exponent; a scale <= 0, which no attention layer uses, takes the composed path).
bool flash_mma_supports(int64_t d, double scale);

// True when every (buffer, layout) pair puts each row start on a 16-byte boundary: the buffer is 16-byte
// aligned and the layout's offset and strides are multiples of 8 bf16 elements. The tile loads are 16-byte
// cp.async vectors, so the kernels below require this of every operand.
bool flash_mma_operands_aligned(std::initializer_list<std::pair<const void*, AttentionLayout>> operands);

void flash_forward_mma(const bf16_t* q, const bf16_t* k, const bf16_t* v, bf16_t* out, float* lse,
                       const AttentionLayouts& layouts, int64_t bh, int64_t t, int64_t d, float scale_log2,
                       cudaStream_t stream, const AttentionDropout& dropout = {});

// Where the backward writes the column sums of a packed [B, T, 3 heads d] gradient (grad_q, grad_k and
// grad_v the parts of one buffer, layouts packed_qkv): [3 heads d] floats, or bf16 when `bf16`. No sums
// when `sums` is null. The kernels add each block's rows as they store them; one small kernel adds the
// blocks (see packed_qkv_column_sums_kernel), so the gradient is never read again for them.
struct PackedColumnSums {
  void* sums = nullptr;
  bool bf16 = false;
  int64_t heads = 1;
};

void flash_backward_mma(const bf16_t* q, const bf16_t* k, const bf16_t* v, const bf16_t* out, const bf16_t* grad_out,
                        const float* lse, bf16_t* grad_q, bf16_t* grad_k, bf16_t* grad_v,
                        const AttentionLayouts& layouts, int64_t bh, int64_t t, int64_t d, float scale, int device,
                        cudaStream_t stream, const PackedColumnSums& column_sums = {},
                        const AttentionDropout& dropout = {});

}  // namespace dpt::cuda_kernels
