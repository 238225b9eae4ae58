#pragma once
// Fused causal attention (FlashAttention-2 style): for q, k, v [B, H, T, D]
//   out[b, h, i] = sum_{j <= i} softmax_j(scale * q_i . k_j) v_j
// without materialising the [B, H, T, T] scores. The forward keeps, per query row, the logsumexp
//   lse_i = log sum_{j <= i} exp(scale * q_i . k_j)
// (float32; float64 for float64 input) and the backward recomputes p_ij = exp(scale * q_i . k_j - lse_i)
// tile by tile. With D_i = sum_d dO_id O_id and dS_ij = p_ij (dO_i . v_j - D_i):
//   dV_j = sum_{i >= j} p_ij dO_i,   dK_j = scale * sum_{i >= j} dS_ij q_i,   dQ_i = scale * sum_{j <= i} dS_ij k_j.
//
// CPU: a reference implementation (double accumulation) for float32, float64, bfloat16 and float16.
// CUDA: own kernels (core/cuda/flash_attention.cu) for float32, bfloat16 (tensor cores) and float16
// (SIMT kernels, float32 arithmetic) with D in {32, 64, 128}; any
// other CUDA case (float64, another head size) takes the composed path matmul -> causal_softmax ->
// matmul, which is mathematically the same op.
#include "core/tensor.h"

namespace dpt {

Tensor causal_attention(const Tensor& q, const Tensor& k, const Tensor& v, double scale);

// True when causal_attention runs the fused CUDA kernels for this dtype and head size.
bool fused_causal_attention_supported(DType dtype, int64_t head_dim);

}  // namespace dpt
