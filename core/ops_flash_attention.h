#pragma once
// Fused causal attention (FlashAttention-2 style): for q, k, v [B, H, T, D]
//   out[b, h, i] = sum_{j <= i} softmax_j(scale * q_i . k_j) v_j
// without materialising the [B, H, T, T] scores. The forward keeps, per query row, the logsumexp
//   lse_i = log sum_{j <= i} exp(scale * q_i . k_j)
// (float32; float64 for float64 input) and the backward recomputes p_ij = exp(scale * q_i . k_j - lse_i)
// tile by tile. With D_i = sum_d dO_id O_id and dS_ij = p_ij (dO_i . v_j - D_i):
//   dV_j = sum_{i >= j} p_ij dO_i,   dK_j = scale * sum_{i >= j} dS_ij q_i,   dQ_i = scale * sum_{j <= i} dS_ij k_j.
//
// Which implementation runs:
//   CPU: the reference kernels (core/cpu/flash_attention.cpp, double accumulation) for every floating dtype.
//   CUDA, in order:
//     1. cuDNN's fused attention engines (core/cuda/sdpa_cudnn.h): causal_attention_qkv in bfloat16, for
//        a forward that records autograd, where cuDNN has an engine for the shape; its deterministic
//        backward follows its forward. With dropout the mask is cuDNN's own Philox draw (same keep rate,
//        other mask than 2. and the CPU draw), which its backward draws again.
//     2. our mma.sync kernels (core/cuda/flash_attention_mma.cu): bfloat16, D in {32, 64, 128}, a positive
//        scale and 16-byte aligned rows. They also carry attention dropout, and run evaluation and
//        sampling, whose sequence length changes from call to call (cuDNN builds a plan per shape).
//     3. the composed op matmul -> causal_softmax -> matmul (scores in memory): every other case (float32,
//        float16, float64, another head size, misaligned rows). It is the same math.
//   DPT_ATTENTION (core/flags.h) narrows this: auto = 1, 2, 3; flash = 2, 3; reference = 3 only.
//
// causal_attention_qkv is the same op on a packed QKV projection, as a transformer layer produces it:
// qkv [B, T, 3C] (C = n_head D; q of head h at columns h D.., k at C + h D.., v at 2C + h D..) ->
// out [B, T, C] (head h at columns h D..), the heads already merged for the output projection. It
// equals splitting qkv into three [B, T, C] parts, viewing each as [B, H, T, D] and calling
// causal_attention, then merging the heads; the fused kernels (CPU reference, cuDNN, mma) read q, k, v in
// place and write out and the [B, T, 3C] gradient directly (core/attention_layout.h), so none of the
// layout copies of that composition are made. Where CUDA composes (3. above), it runs that composition,
// so its results are those of causal_attention.
#include "core/factory.h"
#include "core/tensor.h"

namespace dpt {

Tensor causal_attention(const Tensor& q, const Tensor& k, const Tensor& v, double scale);

// qkv [B, T, 3C] with C a multiple of n_head -> [B, T, C]; see above.
Tensor causal_attention_qkv(const Tensor& qkv, int64_t n_head, double scale);
// The same with dropout p on the attention weights, drawn from `gen` inside the fused kernels: cuDNN's own
// mask under 1. above, else the mask dpt::dropout would draw for the [B, H, T, T] weights
// (core/attention_layout.h), as on the CPU. Only where causal_attention_dropout_fused says so; a
// transformer layer composes the op otherwise.
Tensor causal_attention_qkv(const Tensor& qkv, int64_t n_head, double scale, double dropout, Generator& gen);
bool causal_attention_dropout_fused(const Tensor& qkv, int64_t n_head);

// True for the dtype and head sizes our CUDA kernels are built for (bfloat16, D in {32, 64, 128}); a call
// also needs a positive scale and 16-byte aligned rows, and DPT_ATTENTION other than reference.
bool fused_causal_attention_supported(DType dtype, int64_t head_dim);

}  // namespace dpt
