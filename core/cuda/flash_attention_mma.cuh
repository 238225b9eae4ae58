#pragma once
// bfloat16 fused causal attention on mma.sync tensor-core instructions (core/cuda/flash_attention_mma.cu),
// called by the entry points in core/cuda/flash_attention.cu. Pointers are contiguous [bh, t, d]
// (lse [bh, t], float32, natural log); every tensor must start 16-byte aligned.
#include <cuda_runtime.h>

#include <cstdint>

#include "core/cuda/kernel_utils.cuh"

namespace dpt::cuda_kernels {

// The bfloat16 kernels a call runs: the mma.sync kernels (default), the older WMMA kernels, or the
// float32 SIMT kernels. DPT_FLASH_IMPL=mma|wmma|simt chooses (read per call, so a test or a benchmark
// can compare them in one process); DPT_FLASH_SIMT=1 is the older spelling of simt.
enum class FlashImpl { kMma, kWmma, kSimt };
FlashImpl flash_impl_from_env();

// True for the head sizes the mma kernels are built for, with a positive scale (folded into the
// exponent; a scale <= 0, which no attention layer uses, takes the WMMA kernels).
bool flash_mma_supports(int64_t d, double scale);

void flash_forward_mma(const bf16_t* q, const bf16_t* k, const bf16_t* v, bf16_t* out, float* lse, int64_t bh,
                       int64_t t, int64_t d, float scale_log2, cudaStream_t stream);

void flash_backward_mma(const bf16_t* q, const bf16_t* k, const bf16_t* v, const bf16_t* out, const bf16_t* grad_out,
                        const float* lse, bf16_t* grad_q, bf16_t* grad_k, bf16_t* grad_v, int64_t bh, int64_t t,
                        int64_t d, float scale, int device, cudaStream_t stream);

}  // namespace dpt::cuda_kernels
