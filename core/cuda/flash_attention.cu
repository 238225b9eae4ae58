// The CUDA entry points of fused causal attention (core/flash_attention_kernels.h; math in
// core/ops_flash_attention.h): they check what the mma.sync kernels of core/cuda/flash_attention_mma.cu
// need (bfloat16, D in {32, 64, 128}, a positive scale, 16-byte aligned rows) and run them. The contiguous
// entry points are the strided ones at AttentionLayouts::contiguous. Every other CUDA case is composed by
// the caller (core/ops_flash_attention.cpp), which asks flash_attention_strided_supported first.
#include "core/cuda/flash_attention_mma.cuh"
#include "core/cuda/kernel_utils.cuh"
#include "core/flash_attention_kernels.h"

namespace dpt::cuda_kernels {

namespace {

constexpr float kLog2e = 1.4426950408889634f;

// True when the mma kernels take these operands: bfloat16 buffers, a head size they are built for, a
// positive scale (folded into the exponent) and 16-byte aligned rows.
bool mma_runs_strided(DType dtype, int64_t d, double scale,
                      std::initializer_list<std::pair<const Tensor*, AttentionLayout>> operands) {
  if (dtype != DType::BFloat16 || !flash_mma_supports(d, scale)) return false;
  for (const auto& [buffer, layout] : operands) {
    if (buffer->dtype() != DType::BFloat16 || !flash_mma_operands_aligned({{buffer->data_ptr(), layout}})) return false;
  }
  return true;
}

}  // namespace

void flash_attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                             int64_t bh, int64_t t, int64_t d, double scale) {
  flash_attention_forward_strided(q, k, v, out, lse, AttentionLayouts::contiguous(t, d), bh, t, d, scale);
}

void flash_attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                              const Tensor& grad_out, const Tensor& lse, const Tensor& grad_q, const Tensor& grad_k,
                              const Tensor& grad_v, int64_t bh, int64_t t, int64_t d, double scale) {
  flash_attention_backward_strided(q, k, v, out, grad_out, lse, grad_q, grad_k, grad_v,
                                   AttentionLayouts::contiguous(t, d), bh, t, d, scale, Tensor());
}

bool flash_attention_strided_supported(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                                       const AttentionLayouts& layouts, int64_t d, double scale) {
  return mma_runs_strided(q.dtype(), d, scale,
                          {{&q, layouts.q}, {&k, layouts.k}, {&v, layouts.v}, {&out, layouts.out}});
}

void flash_attention_forward_strided(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                                     const Tensor& lse, const AttentionLayouts& layouts, int64_t bh, int64_t t,
                                     int64_t d, double scale, const AttentionDropout& dropout) {
  if (bh == 0 || t == 0) return;
  const int device = device_of(out, {&q, &k, &v, &lse}, "flash_attention_forward_strided");
  DPT_CHECK(lse.dtype() == DType::Float32,
            "flash_attention_forward_strided (CUDA): expected float32 logsumexp, found {}", dtype_name(lse.dtype()));
  DPT_CHECK(
      mma_runs_strided(q.dtype(), d, scale, {{&q, layouts.q}, {&k, layouts.k}, {&v, layouts.v}, {&out, layouts.out}}),
      "flash_attention_forward_strided (CUDA): expected bfloat16 with head size 32, 64 or 128, a positive "
      "scale and 16-byte aligned rows, found {}, head size {}, scale {}",
      dtype_name(q.dtype()), d, scale);
  flash_forward_mma(q.data<bf16_t>(), k.data<bf16_t>(), v.data<bf16_t>(), out.data<bf16_t>(), lse.data<float>(),
                    layouts, bh, t, d, static_cast<float>(scale) * kLog2e, cuda::current_stream(device), dropout);
}

void flash_attention_backward_strided(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                                      const Tensor& grad_out, const Tensor& lse, const Tensor& grad_q,
                                      const Tensor& grad_k, const Tensor& grad_v, const AttentionLayouts& layouts,
                                      int64_t bh, int64_t t, int64_t d, double scale, const Tensor& grad_sums,
                                      const AttentionDropout& dropout) {
  PackedColumnSums sums;
  if (grad_sums.defined()) {
    const int64_t heads = layouts.q.heads, c = heads * d;
    DPT_CHECK(grad_q.data_ptr() == grad_k.data_ptr() && grad_q.data_ptr() == grad_v.data_ptr() &&
                  layouts.q.row_stride == 3 * c && layouts.k.offset == c && layouts.v.offset == 2 * c &&
                  grad_sums.numel() == 3 * c && grad_sums.is_contiguous() &&
                  (grad_sums.dtype() == DType::Float32 || grad_sums.dtype() == DType::BFloat16),
              "flash_attention_backward_strided (CUDA): column sums need one packed [B, T, {}] gradient and a "
              "contiguous float32 or bfloat16 [{}] output, found {} {}",
              3 * c, 3 * c, shape_str(grad_sums.shape()), dtype_name(grad_sums.dtype()));
    sums = {grad_sums.data_ptr(), grad_sums.dtype() == DType::BFloat16, heads};
    if (bh == 0 || t == 0) {  // no rows: empty sums
      DPT_CUDA_CHECK(
          cudaMemsetAsync(grad_sums.data_ptr(), 0, grad_sums.nbytes(), cuda::current_stream(grad_sums.device().index)));
      return;
    }
  }
  if (bh == 0 || t == 0) return;
  const int device =
      device_of(grad_q, {&q, &k, &v, &out, &grad_out, &lse, &grad_k, &grad_v}, "flash_attention_backward_strided");
  DPT_CHECK(lse.dtype() == DType::Float32,
            "flash_attention_backward_strided (CUDA): expected float32 logsumexp, found {}", dtype_name(lse.dtype()));
  DPT_CHECK(mma_runs_strided(q.dtype(), d, scale,
                             {{&q, layouts.q},
                              {&k, layouts.k},
                              {&v, layouts.v},
                              {&out, layouts.out},
                              {&grad_out, layouts.out},
                              {&grad_q, layouts.q},
                              {&grad_k, layouts.k},
                              {&grad_v, layouts.v}}),
            "flash_attention_backward_strided (CUDA): expected bfloat16 with head size 32, 64 or 128, a positive "
            "scale and 16-byte aligned rows, found {}, head size {}, scale {}",
            dtype_name(q.dtype()), d, scale);
  flash_backward_mma(q.data<bf16_t>(), k.data<bf16_t>(), v.data<bf16_t>(), out.data<bf16_t>(), grad_out.data<bf16_t>(),
                     lse.data<float>(), grad_q.data<bf16_t>(), grad_k.data<bf16_t>(), grad_v.data<bf16_t>(), layouts,
                     bh, t, d, static_cast<float>(scale), device, cuda::current_stream(device), sums, dropout);
}

}  // namespace dpt::cuda_kernels
