#pragma once
// Library handles, created lazily per device on first use (a machine without a GPU never creates one).
// cuBLAS and cuDNN handles are per thread and device, because binding a handle to a stream is not
// thread-safe; each accessor binds the handle to the calling thread's current stream, so library calls
// are ordered with our own kernels.
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cudnn.h>

#include <cstddef>

namespace dpt::cuda {

// Bound to current_stream(device); device -1 means the current device. Math mode: see set_allow_tf32.
cublasHandle_t cublas_handle(int device = -1);
// cuBLASLt handles carry no stream (it is passed per call); one per device, shared by threads.
cublasLtHandle_t cublaslt_handle(int device = -1);
cudnnHandle_t cudnn_handle(int device = -1);

// A scratch buffer for cuBLAS/cuBLASLt on `stream`, from the device's memory pool: one per
// (device, stream), so work on two streams never shares scratch space.
void* gemm_workspace(cudaStream_t stream, int device, size_t* nbytes);

// float32 matrix products use plain IEEE float32 math by default (CUBLAS_DEFAULT_MATH with
// CUBLAS_COMPUTE_32F, no TF32), so they match the CPU to float32 rounding. Allowing TF32 makes
// them several times faster on tensor cores at ~1e-3 relative precision.
void set_allow_tf32(bool allow);
bool allow_tf32();

}  // namespace dpt::cuda
