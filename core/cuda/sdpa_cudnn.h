#pragma once
// Causal attention through cuDNN's fused scaled-dot-product-attention engines, built as backend graphs
// (core/cuda/cudnn_graph.h). Forward:
//   S = scale Q K^T, masked above the diagonal (row >= column kept), softmax over keys, O = P V,
// with the softmax statistics lse = max + log(sum of exponentials) per query row: the same out and lse
// (natural log, float32 [bh, t]) that our mma.sync forward writes. With dropout the weights P are masked
// by a Bernoulli(1 - p) draw of cuDNN's own Philox generator at the draw's seed and offset, and scaled by
// 1 / (1 - p): the same distribution as our kernels' mask, not the same mask. Backward: dQ, dK, dV from those, as
// ours computes them (core/ops_flash_attention.h has the math), deterministically. These engines are the
// default for bfloat16 training forwards (core/ops_flash_attention.h says when they run); our mma.sync
// kernels take every shape they decline.
#include <cstdint>

#include "core/attention_layout.h"
#include "core/tensor.h"

namespace dpt::cuda_kernels {

// Runs the forward for bfloat16 q, k, v and out buffers at `layouts` (the heads of a packed QKV
// projection, say) and returns true, or does nothing and returns false when cuDNN has no engine for this
// shape and layout (a head size it does not run, an older cuDNN): the caller then runs its own kernels.
// A plan is built once per shape and layout on each thread and device, and reused.
bool sdpa_forward_cudnn(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                        const AttentionLayouts& layouts, int64_t bh, int64_t t, int64_t d, double scale,
                        const AttentionDropout& drop = {});

// The backward from the forward's out and lse: writes grad_q, grad_k and grad_v at their operands'
// layouts (the parts of one packed gradient, say) from grad_out at out's layout, bitwise the same on every
// run. `drop` must be the forward's: the backward draws the forward's mask again. Returns false, having
// done nothing, when cuDNN has no engine for it.
bool sdpa_backward_cudnn(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& grad_out,
                         const Tensor& lse, const Tensor& grad_q, const Tensor& grad_k, const Tensor& grad_v,
                         const AttentionLayouts& layouts, int64_t bh, int64_t t, int64_t d, double scale,
                         const AttentionDropout& drop = {});

}  // namespace dpt::cuda_kernels
