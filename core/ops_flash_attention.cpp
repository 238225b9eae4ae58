#include "core/ops_flash_attention.h"

#include "core/autograd.h"
#include "core/error.h"
#include "core/flash_attention_kernels.h"
#include "core/kernel_dispatch.h"
#include "core/ops.h"
#include "core/ops_attention.h"

namespace dpt {

bool fused_causal_attention_supported(DType dtype, int64_t head_dim) {
  return (dtype == DType::Float32 || dtype == DType::BFloat16 || dtype == DType::Float16) &&
         (head_dim == 32 || head_dim == 64 || head_dim == 128);
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
  // CUDA cases without a fused kernel: the composed op, same math, [.., T, T] scores in memory.
  if (q_in.device().is_cuda() && !fused_causal_attention_supported(q_in.dtype(), d)) {
    return matmul(causal_softmax(matmul(q_in, k_in, false, true), scale), v_in);
  }
  Tensor q = q_in.contiguous(), k = k_in.contiguous(), v = v_in.contiguous();
  const int64_t bh = t == 0 || d == 0 ? 0 : q.numel() / (t * d);
  Shape lse_shape(q.shape().begin(), q.shape().end() - 1);
  DType lse_dtype = q.dtype() == DType::Float64 ? DType::Float64 : DType::Float32;
  Tensor out = Tensor::empty(q.shape(), q.options());
  Tensor lse = Tensor::empty(lse_shape, q.options().with_dtype(lse_dtype));
  DPT_KERNEL_DISPATCH(q.device(), flash_attention_forward, q, k, v, out, lse, bh, t, d, scale);
  record_op("CausalAttentionBackward", {q_in, k_in, v_in}, {out},
            [q = q.detach(), k = k.detach(), v = v.detach(), out = out.detach(), lse, bh, t, d,
             scale](const std::vector<Tensor>& g) {
              Tensor gout = g[0].contiguous();
              Tensor gq = Tensor::empty(q.shape(), q.options());
              Tensor gk = Tensor::empty(q.shape(), q.options());
              Tensor gv = Tensor::empty(q.shape(), q.options());
              DPT_KERNEL_DISPATCH(q.device(), flash_attention_backward, q, k, v, out, gout, lse, gq, gk, gv, bh, t, d,
                                  scale);
              return std::vector<Tensor>{gq, gk, gv};
            });
  return out;
}

}  // namespace dpt
