// Matrix products. With C = op(A) op(B), the gradients are dA' = dC op(B)^T and dB' = op(A)^T dC for
// the transposed-or-not operands A' = op(A), B' = op(B); undoing the transpose gives the four cases
// below. A 2-D operand shared across a batch receives the sum of its per-batch gradients.
#include "core/autograd.h"
#include "core/error.h"
#include "core/kernels.h"
#include "core/op_helpers.h"
#include "core/ops.h"

namespace dpt {

namespace {
// GEMM reads contiguous row-major matrices. A view whose last two dims are swapped relative to a
// contiguous layout (k.transpose(-2, -1) in attention) is read as-is with the transpose flag flipped,
// instead of being copied.
Tensor gemm_operand(const Tensor& x, bool* transposed) {
  Tensor d = x.detach();
  if (d.is_contiguous()) return d;
  Shape shape = d.shape(), strides = d.strides();
  std::swap(shape[shape.size() - 1], shape[shape.size() - 2]);
  std::swap(strides[strides.size() - 1], strides[strides.size() - 2]);
  Tensor swapped = make_view(d, shape, strides, d.impl()->offset);
  if (swapped.is_contiguous()) {
    *transposed = !*transposed;
    return swapped;
  }
  return detail::contiguous_data(d);
}
// op(a) @ op(b) into `out` ([batch..., m, n], contiguous): one GEMM, batched when either operand is.
void product_into(const Tensor& a, const Tensor& b, bool transpose_a, bool transpose_b, const Tensor& out) {
  const int64_t m = out.size(-2), n = out.size(-1), k = transpose_a ? a.size(-2) : a.size(-1);
  kernels::GemmArgs args;
  args.batch = shape_numel(Shape(out.shape().begin(), out.shape().end() - 2));
  args.m = m;
  args.n = n;
  args.k = k;
  args.transpose_a = transpose_a;
  args.transpose_b = transpose_b;
  Tensor a_data = gemm_operand(a, &args.transpose_a), b_data = gemm_operand(b, &args.transpose_b);
  args.stride_a = a.dim() == 2 ? 0 : m * k;
  args.stride_b = b.dim() == 2 ? 0 : k * n;
  args.stride_c = m * n;
  kernels::gemm(a_data, b_data, out, args);
}

// The gradient op(x) @ op(y) of an operand. For a 2-D leaf on the CPU whose buffer awaits its first
// gradient since zero_grad() (core/autograd.h), the product is written there and nothing is returned.
// Not on CUDA: cuBLAS may choose its kernel by the output's alignment, so a bucket view could change the
// bits; there the fused linear writes in place (core/ops_linear.cpp), whose kernel choice ignores it.
Tensor leaf_grad(const Tensor& leaf, const Tensor& x, const Tensor& y, bool transpose_x, bool transpose_y) {
  if (x.dim() == 2 && y.dim() == 2 && !x.device().is_cuda()) {
    const Tensor into = first_grad_buffer(leaf);
    if (into.defined() && into.dtype() == x.dtype() && into.device() == x.device()) {
      product_into(x, y, transpose_x, transpose_y, into);
      mark_grad_written(leaf);
      return Tensor();
    }
  }
  return matmul(x, y, transpose_x, transpose_y);
}
}  // namespace

Tensor matmul(const Tensor& a, const Tensor& b, bool transpose_a, bool transpose_b) {
  detail::check_compatible("matmul", a, b);
  detail::check_floating("matmul", a);
  DPT_CHECK(a.dim() >= 2 && b.dim() >= 2, "matmul: expected operands of rank >= 2, found {} and {}",
            shape_str(a.shape()), shape_str(b.shape()));
  const int64_t m = transpose_a ? a.size(-1) : a.size(-2), ka = transpose_a ? a.size(-2) : a.size(-1);
  const int64_t kb = transpose_b ? b.size(-1) : b.size(-2), n = transpose_b ? b.size(-2) : b.size(-1);
  DPT_CHECK(ka == kb, "matmul: inner dimensions differ: {}{} @ {}{} gives k = {} and {}", shape_str(a.shape()),
            transpose_a ? "^T" : "", shape_str(b.shape()), transpose_b ? "^T" : "", ka, kb);
  // [..., m, k] @ [k, n]: fold the batch into the rows and run one 2-D product. Besides being one larger
  // GEMM, it makes the weight's gradient a single [k, n] product instead of a [batch, k, n] stack
  // summed afterwards (for GPT-2's LM head that stack alone was 16 x 50304 x 768 elements).
  if (a.dim() > 2 && b.dim() == 2 && !transpose_a) {
    Shape out_shape(a.shape().begin(), a.shape().end() - 1);
    out_shape.push_back(n);
    return matmul(a.reshape({-1, ka}), b, false, transpose_b).reshape(out_shape);
  }
  Shape batch_a(a.shape().begin(), a.shape().end() - 2), batch_b(b.shape().begin(), b.shape().end() - 2);
  DPT_CHECK(batch_a == batch_b || batch_a.empty() || batch_b.empty(),
            "matmul: batch dims of {} and {} must match, or one operand must be 2-D", shape_str(a.shape()),
            shape_str(b.shape()));
  Shape out_shape = batch_a.empty() ? batch_b : batch_a;
  out_shape.push_back(m);
  out_shape.push_back(n);
  Tensor out = detail::empty_as(a, out_shape);
  product_into(a, b, transpose_a, transpose_b, out);

  bool need_a = a.requires_grad(), need_b = b.requires_grad();
  Tensor sa = a.detach(), sb = b.detach();
  // The operands themselves where they are leaves: a 2-D one's gradient may go straight into its buffer.
  Tensor leaf_a = need_a && !a.grad_fn() ? a : Tensor(), leaf_b = need_b && !b.grad_fn() ? b : Tensor();
  record_op("MatmulBackward", {a, b}, {out},
            [sa, sb, leaf_a, leaf_b, transpose_a, transpose_b, need_a, need_b](const std::vector<Tensor>& grads) {
              const Tensor& g = grads[0];
              Tensor ga, gb;
              if (need_a) {
                ga = transpose_a ? leaf_grad(leaf_a, sb, g, transpose_b, true)
                                 : leaf_grad(leaf_a, g, sb, false, !transpose_b);
                if (ga.defined()) ga = sum_to_shape(ga, sa.shape());
              }
              if (need_b) {
                gb = transpose_b ? leaf_grad(leaf_b, g, sa, true, transpose_a)
                                 : leaf_grad(leaf_b, sa, g, !transpose_a, false);
                if (gb.defined()) gb = sum_to_shape(gb, sb.shape());
              }
              return std::vector<Tensor>{ga, gb};
            });
  return out;
}

}  // namespace dpt
