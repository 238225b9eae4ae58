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
//
// causal_attention_qkv is the same op on a packed QKV projection, as a transformer layer produces it:
// qkv [B, T, 3C] (C = n_head D; q of head h at columns h D.., k at C + h D.., v at 2C + h D..) ->
// out [B, T, C] (head h at columns h D..), the heads already merged for the output projection. It
// equals splitting qkv into three [B, T, C] parts, viewing each as [B, H, T, D] and calling
// causal_attention, then merging the heads; the kernels read q, k, v in place and write out and the
// [B, T, 3C] gradient directly (core/attention_layout.h), so none of the layout copies of that
// composition (three inputs, the output, grad_out, three gradients and their concat) are made.
// CPU: the reference, through the same layouts (every floating dtype). CUDA: cuDNN's fused attention or
// the mma.sync kernels (see set_cudnn_attention below) for bfloat16 with D in {32, 64, 128}, 16-byte
// aligned rows (C a multiple of 8) and DPT_FLASH_IMPL unset or mma; every other CUDA case runs the
// composition above, so its results are those of causal_attention.
#include "core/factory.h"
#include "core/tensor.h"

namespace dpt {

Tensor causal_attention(const Tensor& q, const Tensor& k, const Tensor& v, double scale);

// qkv [B, T, 3C] with C a multiple of n_head -> [B, T, C]; see above.
Tensor causal_attention_qkv(const Tensor& qkv, int64_t n_head, double scale);
// The same with dropout p on the attention weights, drawn from `gen` inside the mma.sync kernels (the mask
// dpt::dropout would draw for the [B, H, T, T] weights: core/attention_layout.h). Only where
// causal_attention_dropout_fused says so; a transformer layer composes the op otherwise.
Tensor causal_attention_qkv(const Tensor& qkv, int64_t n_head, double scale, double dropout, Generator& gen);
bool causal_attention_dropout_fused(const Tensor& qkv, int64_t n_head);

// causal_attention_qkv on CUDA through cuDNN's fused attention engines (core/cuda/sdpa_cudnn.h) where
// cuDNN has them for the shape, our mma.sync kernels otherwise: a forward on cuDNN takes cuDNN's backward
// (deterministic; DPT_CUDNN_ATTENTION_BACKWARD=accumulate for its faster atomic one, =off for ours), a
// forward on ours takes ours. Only forwards that record autograd use cuDNN (one plan per shape, built
// once): evaluation and sampling, whose shapes change from call to call, run ours. On by default;
// DPT_ATTENTION=flash or set_cudnn_attention(false) turns it off (core/flags.h).
void set_cudnn_attention(bool enabled);
bool cudnn_attention_enabled();

// True when causal_attention runs the fused CUDA kernels for this dtype and head size.
bool fused_causal_attention_supported(DType dtype, int64_t head_dim);

}  // namespace dpt
