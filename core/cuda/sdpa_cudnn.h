#pragma once
// Causal attention forward through cuDNN's fused scaled-dot-product-attention engine, built as a backend
// graph (core/cuda/cudnn_graph.h):
//   S = scale Q K^T, masked above the diagonal (row >= column kept), softmax over keys, O = P V,
// with the softmax statistics lse = max + log(sum of exponentials) per query row: the same out and lse
// (natural log, float32 [bh, t]) that our mma.sync forward writes, so our backward kernels run on either.
// It is a faster forward on Hopper (warpgroup MMA); the mma.sync forward stays as the fallback and as the
// reference the tests compare it with.
#include <cstdint>

#include "core/attention_layout.h"
#include "core/tensor.h"

namespace dpt::cuda_kernels {

// Runs the forward for bfloat16 q, k, v and out buffers at `layouts` (the heads of a packed QKV
// projection, say) and returns true, or does nothing and returns false when cuDNN has no engine for this
// shape and layout (a head size it does not run, an older cuDNN): the caller then runs its own kernels.
// A plan is built once per shape and layout on each thread and device, and reused.
bool sdpa_forward_cudnn(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                        const AttentionLayouts& layouts, int64_t bh, int64_t t, int64_t d, double scale);

}  // namespace dpt::cuda_kernels
