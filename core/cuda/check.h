#pragma once
// Status checks for every CUDA runtime, cuBLAS and cuDNN call: a failure throws dpt::Error naming the
// call as written, where it was made (file:line) and the library's own description of the status.
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include "core/error.h"

namespace dpt::cuda {

[[noreturn]] inline void fail_cuda(cudaError_t status, const char* call, const char* file, int line) {
  // Clear the runtime's last-error slot: a non-sticky failure reported here must not resurface as the
  // status of a later, unrelated launch check.
  (void)cudaGetLastError();
  ::dpt::throw_error(
      file, line,
      fmt::format("CUDA call {} failed: {} ({})", call, cudaGetErrorString(status), cudaGetErrorName(status)));
}

[[noreturn]] inline void fail_cublas(cublasStatus_t status, const char* call, const char* file, int line) {
  ::dpt::throw_error(file, line,
                     fmt::format("cuBLAS call {} failed: {} (status {})", call, cublasGetStatusString(status),
                                 static_cast<int>(status)));
}

[[noreturn]] inline void fail_cudnn(cudnnStatus_t status, const char* call, const char* file, int line) {
  ::dpt::throw_error(
      file, line,
      fmt::format("cuDNN call {} failed: {} (status {})", call, cudnnGetErrorString(status), static_cast<int>(status)));
}

}  // namespace dpt::cuda

#define DPT_CUDA_CHECK(call)                                                                        \
  do {                                                                                              \
    cudaError_t dpt_status_ = (call);                                                               \
    if (dpt_status_ != cudaSuccess) ::dpt::cuda::fail_cuda(dpt_status_, #call, __FILE__, __LINE__); \
  } while (0)

#define DPT_CUBLAS_CHECK(call)                                                                                  \
  do {                                                                                                          \
    cublasStatus_t dpt_status_ = (call);                                                                        \
    if (dpt_status_ != CUBLAS_STATUS_SUCCESS) ::dpt::cuda::fail_cublas(dpt_status_, #call, __FILE__, __LINE__); \
  } while (0)

#define DPT_CUDNN_CHECK(call)                                                                                 \
  do {                                                                                                        \
    cudnnStatus_t dpt_status_ = (call);                                                                       \
    if (dpt_status_ != CUDNN_STATUS_SUCCESS) ::dpt::cuda::fail_cudnn(dpt_status_, #call, __FILE__, __LINE__); \
  } while (0)

// After a kernel launch: a bad configuration (too many threads, too much shared memory) is reported
// by cudaGetLastError at once; faults inside the kernel surface at the next synchronising call.
#define DPT_CUDA_CHECK_LAUNCH() DPT_CUDA_CHECK(cudaGetLastError())
