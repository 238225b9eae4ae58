#include "core/ops_flash_attention.h"

#include <cstdint>
#include <vector>

#include "core/autograd.h"
#include "core/error.h"
#include "core/flags.h"
#include "core/flash_attention_kernels.h"
#include "core/grad_column_sums.h"
#include "core/kernel_dispatch.h"
#include "core/ops.h"
#include "core/ops_attention.h"

#ifdef DPT_HAVE_CUDA
#include "core/cuda/sdpa_cudnn.h"
#endif

namespace dpt {

namespace {

// DPT_ATTENTION's values, in the order of core/flags.cpp.
enum class AttentionPath { kAuto, kFlash, kReference };
[[maybe_unused]] AttentionPath attention_path() { return static_cast<AttentionPath>(flag_choice(Flag::Attention)); }

// True when our mma.sync kernels take a CUDA call on these buffers (core/flash_attention_kernels.h):
// bfloat16, a head size they are built for, a positive scale, 16-byte aligned rows; and DPT_ATTENTION is
// not reference.
bool cuda_kernels_run([[maybe_unused]] const Tensor& q, [[maybe_unused]] const Tensor& k,
                      [[maybe_unused]] const Tensor& v, [[maybe_unused]] const Tensor& out,
                      [[maybe_unused]] const AttentionLayouts& layouts, [[maybe_unused]] int64_t d,
                      [[maybe_unused]] double scale) {
#ifdef DPT_HAVE_CUDA
  return attention_path() != AttentionPath::kReference &&
         cuda_kernels::flash_attention_strided_supported(q, k, v, out, layouts, d, scale);
#else
  return false;
#endif
}

// The kernels read grad_out rows as 16-byte vectors: a view starting off a 16-byte boundary (never a fresh
// gradient) is copied.
Tensor aligned_grad_out(const Tensor& g) {
  Tensor gout = g.contiguous();
  if (reinterpret_cast<uintptr_t>(gout.data_ptr()) % 16 != 0) gout = gout.clone();
  return gout;
}

}  // namespace

bool fused_causal_attention_supported(DType dtype, int64_t head_dim) {
  return dtype == DType::BFloat16 && (head_dim == 32 || head_dim == 64 || head_dim == 128);
}

Tensor causal_attention(const Tensor& q_in, const Tensor& k_in, const Tensor& v_in, double scale) {
  DPT_CHECK(q_in.dim() >= 2 && q_in.shape() == k_in.shape() && q_in.shape() == v_in.shape(),
            "causal_attention: expected q, k, v of one shape [..., T, D], found {}, {}, {}", shape_str(q_in.shape()),
            shape_str(k_in.shape()), shape_str(v_in.shape()));
  DPT_CHECK(q_in.device() == k_in.device() && q_in.device() == v_in.device(),
            "causal_attention: q on {}, k on {}, v on {}", q_in.device().str(), k_in.device().str(),
            v_in.device().str());
  DPT_CHECK(is_floating(q_in.dtype()) && q_in.dtype() == k_in.dtype() && q_in.dtype() == v_in.dtype(),
            "causal_attention: expected q, k, v of one floating dtype, found {}, {}, {}", dtype_name(q_in.dtype()),
            dtype_name(k_in.dtype()), dtype_name(v_in.dtype()));
  const int64_t t = q_in.size(-2), d = q_in.size(-1);
  // CUDA cases our kernels do not take: the composed op, same math, [.., T, T] scores in memory.
  auto composed = [&] { return matmul(causal_softmax(matmul(q_in, k_in, false, true), scale), v_in); };
  const bool cuda = q_in.device().is_cuda();
  if (cuda && !fused_causal_attention_supported(q_in.dtype(), d)) return composed();
  Tensor q = q_in.contiguous(), k = k_in.contiguous(), v = v_in.contiguous();
  // The output, a fresh allocation, is aligned: q stands in for it.
  if (cuda && !cuda_kernels_run(q, k, v, q, AttentionLayouts::contiguous(t, d), d, scale)) return composed();
  Tensor out = Tensor::empty(q.shape(), q.options());
  const int64_t bh = t == 0 || d == 0 ? 0 : q.numel() / (t * d);
  Shape lse_shape(q.shape().begin(), q.shape().end() - 1);
  DType lse_dtype = q.dtype() == DType::Float64 ? DType::Float64 : DType::Float32;
  Tensor lse = Tensor::empty(lse_shape, q.options().with_dtype(lse_dtype));
  DPT_KERNEL_DISPATCH(q.device(), flash_attention_forward, q, k, v, out, lse, bh, t, d, scale);
  record_op("CausalAttentionBackward", {q_in, k_in, v_in}, {out},
            [q = q.detach(), k = k.detach(), v = v.detach(), out = out.detach(), lse, bh, t, d,
             scale](const std::vector<Tensor>& g) {
              Tensor gout = aligned_grad_out(g[0]);
              Tensor gq = Tensor::empty(q.shape(), q.options());
              Tensor gk = Tensor::empty(q.shape(), q.options());
              Tensor gv = Tensor::empty(q.shape(), q.options());
              DPT_KERNEL_DISPATCH(q.device(), flash_attention_backward, q, k, v, out, gout, lse, gq, gk, gv, bh, t, d,
                                  scale);
              return std::vector<Tensor>{gq, gk, gv};
            });
  return out;
}

namespace {

// causal_attention_qkv as the composition it replaces (and what layers/attention.cpp did before it):
// split, heads [B, T, C] -> [B, H, T, D], causal_attention, heads merged back to [B, T, C].
Tensor composed_attention_qkv(const Tensor& qkv, int64_t n_head, double scale) {
  const int64_t b = qkv.size(0), t = qkv.size(1), c = qkv.size(2) / 3, d = c / n_head;
  std::vector<Tensor> parts = split(qkv, {c, c, c}, 2);
  auto heads = [&](const Tensor& p) { return p.reshape({b, t, n_head, d}).permute({0, 2, 1, 3}); };
  Tensor y = causal_attention(heads(parts[0]), heads(parts[1]), heads(parts[2]), scale);
  return y.permute({0, 2, 1, 3}).reshape({b, t, c});
}

}  // namespace

bool causal_attention_dropout_fused(const Tensor& qkv, int64_t n_head) {
  if (!qkv.device().is_cuda() || n_head <= 0 || qkv.dim() != 3 || qkv.size(2) % (3 * n_head) != 0) return false;
  const int64_t c = qkv.size(2) / 3, d = c / n_head;
  const AttentionLayouts layouts = AttentionLayouts::packed_qkv(n_head, qkv.size(1), d);
  // The output [B, T, C] is a fresh allocation: aligned whenever its rows are (C a multiple of 8).
  return qkv.is_contiguous() && c % 8 == 0 && cuda_kernels_run(qkv, qkv, qkv, qkv, layouts, d, 1.0);
}

Tensor causal_attention_qkv(const Tensor& qkv, int64_t n_head, double scale) {
  Generator unused;
  return causal_attention_qkv(qkv, n_head, scale, 0.0, unused);
}

Tensor causal_attention_qkv(const Tensor& qkv_in, int64_t n_head, double scale, double dropout, Generator& gen) {
  DPT_CHECK(n_head > 0, "causal_attention_qkv: expected a positive head count, found {}", n_head);
  DPT_CHECK(qkv_in.dim() == 3 && qkv_in.size(2) % (3 * n_head) == 0,
            "causal_attention_qkv: expected qkv [B, T, 3C] with C a multiple of n_head = {}, found {}", n_head,
            shape_str(qkv_in.shape()));
  DPT_CHECK(is_floating(qkv_in.dtype()), "causal_attention_qkv: expected a floating dtype, found {}",
            dtype_name(qkv_in.dtype()));
  const int64_t b = qkv_in.size(0), t = qkv_in.size(1), c = qkv_in.size(2) / 3, d = c / n_head, bh = b * n_head;
  Tensor qkv = qkv_in.contiguous();
  // q, k, v are read in place from the packed tensor; out is [B, T, C] with the heads merged.
  const AttentionLayouts layouts = AttentionLayouts::packed_qkv(n_head, t, d);
  Tensor out = Tensor::empty({b, t, c}, qkv.options());
  if (qkv.device().is_cuda() && !cuda_kernels_run(qkv, qkv, qkv, out, layouts, d, scale)) {
    DPT_CHECK(dropout == 0, "causal_attention_qkv: dropout needs the fused kernels (causal_attention_dropout_fused)");
    return composed_attention_qkv(qkv_in, n_head, scale);
  }
  DPT_CHECK(dropout >= 0 && dropout < 1, "causal_attention_qkv: dropout must be in [0, 1), got {}", dropout);
  DPT_CHECK(dropout == 0 || qkv.device().is_cuda(),
            "causal_attention_qkv: dropout runs in the CUDA kernels only; the CPU composes the op");
  AttentionDropout drop;
  if (dropout > 0) drop = {static_cast<float>(dropout), gen.draw(static_cast<uint64_t>(bh * t * t))};
  DType lse_dtype = qkv.dtype() == DType::Float64 ? DType::Float64 : DType::Float32;
  Tensor lse = Tensor::empty({b, n_head, t}, qkv.options().with_dtype(lse_dtype));
  // cuDNN's fused engine where it has one (DPT_ATTENTION=auto), our kernels otherwise. The forward
  // that ran chooses the backward: cuDNN's after cuDNN's (it may still decline), ours after ours. Only
  // a forward that records autograd (a training step) goes to cuDNN: it builds a plan per shape (a
  // fraction of a second), repaid by the thousands of steps of one shape, not by evaluation or sampling,
  // where each generated token brings a new sequence length.
  bool on_cudnn = false;
#ifdef DPT_HAVE_CUDA
  if (qkv.device().is_cuda() && attention_path() == AttentionPath::kAuto && grad_mode_enabled()) {
    on_cudnn = cuda_kernels::sdpa_forward_cudnn(qkv, qkv, qkv, out, lse, layouts, bh, t, d, scale, drop);
  }
#endif
  if (!on_cudnn) {
    DPT_KERNEL_DISPATCH(qkv.device(), flash_attention_forward_strided, qkv, qkv, qkv, out, lse, layouts, bh, t, d,
                        scale, drop);
  }
  // Our backward writes every element of the packed gradient: it takes over the column sums of the
  // linear that produced qkv (its bias gradient, core/grad_column_sums.h). cuDNN's backward does not;
  // the linear then sums the gradient's columns itself.
  std::shared_ptr<GradColumnSums> sums = grad_mode_enabled() ? claim_grad_column_sums(qkv_in) : nullptr;
  if (sums && sums->columns() != 3 * c) sums = nullptr;
  record_op("CausalAttentionQkvBackward", {qkv_in}, {out},
            [qkv = qkv.detach(), out = out.detach(), lse, layouts, bh, t, d, scale, sums, on_cudnn,
             drop](const std::vector<Tensor>& g) {
              // grad_out has out's layout ([B, T, C] contiguous); the gradient is one packed [B, T, 3C]
              // tensor whose q, k and v columns the kernels write directly.
              Tensor gout = aligned_grad_out(g[0]);
              Tensor grad = Tensor::empty(qkv.shape(), qkv.options());
#ifdef DPT_HAVE_CUDA
              if (on_cudnn && cuda_kernels::sdpa_backward_cudnn(qkv, qkv, qkv, out, gout, lse, grad, grad, grad,
                                                                layouts, bh, t, d, scale, drop)) {
                return std::vector<Tensor>{grad};
              }
#endif
              Tensor grad_sums;
              if (sums) {  // the kernels write the gradient's dtype or float32; another bias dtype is converted
                const DType kernel_dtype = sums->dtype() == qkv.dtype() ? qkv.dtype() : DType::Float32;
                grad_sums = Tensor::empty({sums->columns()}, qkv.options().with_dtype(kernel_dtype));
              }
              DPT_KERNEL_DISPATCH(qkv.device(), flash_attention_backward_strided, qkv, qkv, qkv, out, gout, lse, grad,
                                  grad, grad, layouts, bh, t, d, scale, grad_sums, drop);
              if (sums) sums->deliver(grad, grad_sums.to(sums->dtype()));
              return std::vector<Tensor>{grad};
            });
  return out;
}

}  // namespace dpt
