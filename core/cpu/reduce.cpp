// Reductions over the middle dim of a contiguous [outer, n, inner] view.
// Sums accumulate in double (int64 for integers) in index order, so results are deterministic.
#include <type_traits>

#include "core/cpu/cpu_kernels.h"
#include "core/cpu/dispatch.h"

namespace dpt::cpu {

void reduce(ReduceOp op, const Tensor& in, int64_t outer, int64_t n, int64_t inner, const Tensor& out,
            const Tensor& indices) {
  DPT_CHECK(in.is_contiguous() && out.is_contiguous() && in.numel() == outer * n * inner &&
                out.numel() == outer * inner && in.dtype() == out.dtype(),
            "reduce kernel: input {} {} does not view as [{}, {}, {}] into output {} {}", shape_str(in.shape()),
            dtype_name(in.dtype()), outer, n, inner, shape_str(out.shape()), dtype_name(out.dtype()));
  int64_t* idx = nullptr;
  if (indices.defined()) {
    DPT_CHECK(indices.dtype() == DType::Int64 && indices.numel() == outer * inner && indices.is_contiguous(),
              "reduce kernel: indices must be contiguous int64 with {} elements", outer * inner);
    idx = indices.data<int64_t>();
  }
  DPT_CHECK(op == ReduceOp::Sum || n > 0, "reduce kernel: max over an empty dimension");
  visit_all(out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    using Acc = std::conditional_t<std::is_integral_v<T>, int64_t, double>;
    const T* x = in.data<T>();
    T* y = out.data<T>();
    for (int64_t o = 0; o < outer; ++o) {
      for (int64_t i = 0; i < inner; ++i) {
        const T* col = x + o * n * inner + i;
        if (op == ReduceOp::Sum) {
          Acc acc = 0;
          for (int64_t j = 0; j < n; ++j) acc += convert<Acc>(col[j * inner]);
          y[o * inner + i] = convert<T>(acc);
        } else {
          // Strictly greater: the first maximum wins.
          Acc best = convert<Acc>(col[0]);
          int64_t best_j = 0;
          for (int64_t j = 1; j < n; ++j) {
            Acc v = convert<Acc>(col[j * inner]);
            if (v > best) {
              best = v;
              best_j = j;
            }
          }
          y[o * inner + i] = col[best_j * inner];
          if (idx) idx[o * inner + i] = best_j;
        }
      }
    }
  });
}

void max_backward(const Tensor& grad, const Tensor& indices, int64_t outer, int64_t n, int64_t inner,
                  const Tensor& grad_in) {
  DPT_CHECK(grad.is_contiguous() && indices.is_contiguous() && grad_in.is_contiguous() &&
                grad.numel() == outer * inner && grad_in.numel() == outer * n * inner &&
                indices.dtype() == DType::Int64 && grad.dtype() == grad_in.dtype(),
            "max_backward kernel: grad {} and indices {} do not fit grad_in {} as [{}, {}, {}]",
            shape_str(grad.shape()), shape_str(indices.shape()), shape_str(grad_in.shape()), outer, n, inner);
  // grad_in is written only at the argmax positions; the caller zero-fills it.
  visit_floating(grad_in.dtype(), "max_backward", [&](auto tag) {
    using T = decltype(tag);
    const T* g = grad.data<T>();
    const int64_t* idx = indices.data<int64_t>();
    T* gi = grad_in.data<T>();
    for (int64_t o = 0; o < outer; ++o) {
      for (int64_t i = 0; i < inner; ++i) gi[(o * n + idx[o * inner + i]) * inner + i] = g[o * inner + i];
    }
  });
}

}  // namespace dpt::cpu
