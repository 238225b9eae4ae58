// Batched row-major GEMM through cuBLAS: C[b] = alpha * op(A[b]) @ op(B[b]) + beta * C[b].
//
// cuBLAS is column-major. A row-major m x n matrix is the same bytes as a column-major n x m matrix
// (its transpose), so we ask cuBLAS for C^T = op(B)^T @ op(A)^T: the operands swap places, m and n
// swap, and each operand's leading dimension is its row length in row-major storage.
//   float32  cublasGemmStridedBatchedEx, CUBLAS_COMPUTE_32F: IEEE float32, no TF32 unless
//            cuda::set_allow_tf32(true) (then CUBLAS_COMPUTE_32F_FAST_TF32);
//   bfloat16 the same call with bf16 storage and float32 accumulation (tensor cores);
//   float16  likewise with fp16 storage (CUDA_R_16F) and float32 accumulation, so long dot products
//            neither overflow nor lose digits in half precision;
//   float64  cublasDgemmStridedBatched.
// The handle is bound to the current stream with a 32 MiB workspace from the memory pool
// (core/cuda/handles.h). Stride 0 on A or B shares that matrix across the batch.
#include <climits>

#include "core/cuda/cuda_kernels.h"
#include "core/cuda/handles.h"
#include "core/cuda/kernel_utils.cuh"

namespace dpt::cuda_kernels {

void gemm(const Tensor& a, const Tensor& b, const Tensor& c, const GemmArgs& args) {
  DPT_CHECK(
      a.is_contiguous() && b.is_contiguous() && c.is_contiguous() && a.dtype() == c.dtype() && b.dtype() == c.dtype(),
      "gemm kernel (CUDA): expected contiguous operands of one dtype, found {} {}, {} {}, {} {}", shape_str(a.shape()),
      dtype_name(a.dtype()), shape_str(b.shape()), dtype_name(b.dtype()), shape_str(c.shape()), dtype_name(c.dtype()));
  DPT_CHECK(c.numel() >= (args.batch - 1) * args.stride_c + args.m * args.n &&
                a.numel() >= (args.batch - 1) * args.stride_a + args.m * args.k &&
                b.numel() >= (args.batch - 1) * args.stride_b + args.k * args.n,
            "gemm kernel (CUDA): batch {} of [{}, {}] @ [{}, {}] overruns the operands", args.batch, args.m, args.k,
            args.k, args.n);
  DPT_CHECK(args.m <= INT_MAX && args.n <= INT_MAX && args.k <= INT_MAX && args.batch <= INT_MAX,
            "gemm kernel (CUDA): sizes m={} n={} k={} batch={} exceed cuBLAS's 32-bit limits", args.m, args.n, args.k,
            args.batch);
  DPT_CHECK(args.batch <= 1 || args.stride_c >= args.m * args.n,
            "gemm kernel (CUDA): output batch stride {} overlaps [{}, {}] results", args.stride_c, args.m, args.n);
  const int device = device_of(c, {&a, &b}, "gemm kernel");
  if (args.batch == 0 || args.m == 0 || args.n == 0) return;
  cuda::DeviceGuard guard(device);
  if (args.k == 0) {
    // Empty products: C = beta * C, and beta == 0 must not read C (it may hold NaN garbage).
    if (args.beta == 0) {
      fill(c, 0.0);
    } else if (args.beta != 1) {
      unary(UnaryOp::Scale, c, c, args.beta);
    }
    return;
  }

  cublasHandle_t handle = cuda::cublas_handle(device);
  const int m = static_cast<int>(args.m), n = static_cast<int>(args.n), k = static_cast<int>(args.k);
  const int batch = static_cast<int>(args.batch);
  // Swapped operands (see the top): cuBLAS's first operand is our B, its second our A.
  const cublasOperation_t op_first = args.transpose_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_second = args.transpose_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const int ld_first = args.transpose_b ? k : n;   // row length of B as stored
  const int ld_second = args.transpose_a ? m : k;  // row length of A as stored
  const int ldc = n;

  switch (c.dtype()) {
    case DType::Float64: {
      const double alpha = args.alpha, beta = args.beta;
      DPT_CUBLAS_CHECK(cublasDgemmStridedBatched(handle, op_first, op_second, n, m, k, &alpha, ptr<const double>(b),
                                                 ld_first, args.stride_b, ptr<const double>(a), ld_second,
                                                 args.stride_a, &beta, ptr<double>(c), ldc, args.stride_c, batch));
      break;
    }
    case DType::Float32:
    case DType::BFloat16:
    case DType::Float16: {
      const float alpha = static_cast<float>(args.alpha), beta = static_cast<float>(args.beta);
      const cudaDataType_t type = c.dtype() == DType::Float32    ? CUDA_R_32F
                                  : c.dtype() == DType::BFloat16 ? CUDA_R_16BF
                                                                 : CUDA_R_16F;
      const cublasComputeType_t compute =
          c.dtype() == DType::Float32 && cuda::allow_tf32() ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
      DPT_CUBLAS_CHECK(cublasGemmStridedBatchedEx(handle, op_first, op_second, n, m, k, &alpha, b.data_ptr(), type,
                                                  ld_first, args.stride_b, a.data_ptr(), type, ld_second, args.stride_a,
                                                  &beta, c.data_ptr(), type, ldc, args.stride_c, batch, compute,
                                                  CUBLAS_GEMM_DEFAULT));
      break;
    }
    default:
      DPT_FAIL("gemm kernel (CUDA): expected a floating dtype, found {}", dtype_name(c.dtype()));
  }
}

}  // namespace dpt::cuda_kernels
