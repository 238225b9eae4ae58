// Batched row-major GEMM through Eigen: C[b] = alpha * op(A[b]) @ op(B[b]) + beta * C[b].
// bfloat16 and float16 operands are widened to float32 once, multiplied in float32 and rounded on store.
#include <Eigen/Core>
#include <vector>

#include "core/cpu/cpu_kernels.h"
#include "core/cpu/dispatch.h"

namespace dpt::cpu {

namespace {

template <class T>
using RowMatrix = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

template <class T>
void gemm_typed(const T* a, const T* b, T* c, const GemmArgs& g) {
  const int64_t a_rows = g.transpose_a ? g.k : g.m, a_cols = g.transpose_a ? g.m : g.k;
  const int64_t b_rows = g.transpose_b ? g.n : g.k, b_cols = g.transpose_b ? g.k : g.n;
  const T alpha = static_cast<T>(g.alpha), beta = static_cast<T>(g.beta);
  for (int64_t i = 0; i < g.batch; ++i) {
    Eigen::Map<const RowMatrix<T>> A(a + i * g.stride_a, a_rows, a_cols);
    Eigen::Map<const RowMatrix<T>> B(b + i * g.stride_b, b_rows, b_cols);
    Eigen::Map<RowMatrix<T>> C(c + i * g.stride_c, g.m, g.n);
    // beta == 0 must not read C: it may be uninitialized (0 * NaN is NaN).
    if (g.beta == 0) {
      C.setZero();
    } else if (g.beta != 1) {
      C *= beta;
    }
    if (g.k == 0) continue;
    if (!g.transpose_a && !g.transpose_b) C.noalias() += alpha * (A * B);
    if (!g.transpose_a && g.transpose_b) C.noalias() += alpha * (A * B.transpose());
    if (g.transpose_a && !g.transpose_b) C.noalias() += alpha * (A.transpose() * B);
    if (g.transpose_a && g.transpose_b) C.noalias() += alpha * (A.transpose() * B.transpose());
  }
}

template <class H>
std::vector<float> widen(const Tensor& t) {
  std::vector<float> out(static_cast<size_t>(t.numel()));
  const H* p = t.data<H>();
  for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<float>(p[i]);
  return out;
}

// 16-bit operands: one float32 product, rounded once into c.
template <class H>
void gemm_half_width(const Tensor& a, const Tensor& b, const Tensor& c, const GemmArgs& args) {
  std::vector<float> fa = widen<H>(a), fb = widen<H>(b);
  std::vector<float> fc = args.beta == 0 ? std::vector<float>(static_cast<size_t>(c.numel())) : widen<H>(c);
  gemm_typed(fa.data(), fb.data(), fc.data(), args);
  H* pc = c.data<H>();
  for (size_t i = 0; i < fc.size(); ++i) pc[i] = H(fc[i]);
}

}  // namespace

void gemm(const Tensor& a, const Tensor& b, const Tensor& c, const GemmArgs& args) {
  DPT_CHECK(
      a.is_contiguous() && b.is_contiguous() && c.is_contiguous() && a.dtype() == c.dtype() && b.dtype() == c.dtype(),
      "gemm kernel: expected contiguous operands of one dtype, found {} {}, {} {}, {} {}", shape_str(a.shape()),
      dtype_name(a.dtype()), shape_str(b.shape()), dtype_name(b.dtype()), shape_str(c.shape()), dtype_name(c.dtype()));
  DPT_CHECK(c.numel() >= (args.batch - 1) * args.stride_c + args.m * args.n &&
                a.numel() >= (args.batch - 1) * args.stride_a + args.m * args.k &&
                b.numel() >= (args.batch - 1) * args.stride_b + args.k * args.n,
            "gemm kernel: batch {} of [{}, {}] @ [{}, {}] overruns the operands", args.batch, args.m, args.k, args.k,
            args.n);
  switch (c.dtype()) {
    case DType::Float32:
      gemm_typed(a.data<float>(), b.data<float>(), c.data<float>(), args);
      break;
    case DType::Float64:
      gemm_typed(a.data<double>(), b.data<double>(), c.data<double>(), args);
      break;
    case DType::BFloat16:
      gemm_half_width<bf16>(a, b, c, args);
      break;
    case DType::Float16:
      gemm_half_width<f16>(a, b, c, args);
      break;
    default:
      DPT_FAIL("gemm kernel: expected a floating dtype, found {}", dtype_name(c.dtype()));
  }
}

}  // namespace dpt::cpu
