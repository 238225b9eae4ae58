#include "core/cuda/handles.h"

#include <array>
#include <atomic>
#include <map>
#include <mutex>
#include <utility>

#include "core/cuda/check.h"
#include "core/cuda/stream.h"

namespace dpt::cuda {

namespace {

constexpr int kMaxDevices = 64;
// cuBLAS asks for 32 MiB of workspace on Hopper to pick its fastest kernels.
constexpr size_t kGemmWorkspaceBytes = size_t{32} << 20;

std::atomic<bool> g_allow_tf32{false};

int resolve_device(int device) {
  if (device < 0) DPT_CUDA_CHECK(cudaGetDevice(&device));
  DPT_CHECK(device < kMaxDevices, "CUDA device {} is beyond the {} devices dptrain supports", device, kMaxDevices);
  return device;
}

// Per-thread handles, destroyed when the thread exits (errors ignored: at process exit the driver may
// already be gone).
struct ThreadHandles {
  std::array<cublasHandle_t, kMaxDevices> cublas{};
  std::array<cudnnHandle_t, kMaxDevices> cudnn{};
  ~ThreadHandles() {
    for (int d = 0; d < kMaxDevices; ++d) {
      if (cublas[d]) (void)cublasDestroy(cublas[d]);
      if (cudnn[d]) (void)cudnnDestroy(cudnn[d]);
    }
  }
};
thread_local ThreadHandles t_handles;

std::array<cublasLtHandle_t, kMaxDevices> g_lt_handles{};
std::mutex g_lt_mutex;

std::map<std::pair<int, cudaStream_t>, void*> g_workspaces;
std::mutex g_workspace_mutex;

}  // namespace

cublasHandle_t cublas_handle(int device) {
  device = resolve_device(device);
  cublasHandle_t& handle = t_handles.cublas[device];
  if (!handle) {
    DeviceGuard guard(device);
    DPT_CUBLAS_CHECK(cublasCreate(&handle));
    // Explicit IEEE float32 by default: see set_allow_tf32. Alpha/beta are host scalars.
    DPT_CUBLAS_CHECK(cublasSetMathMode(handle, CUBLAS_DEFAULT_MATH));
    DPT_CUBLAS_CHECK(cublasSetPointerMode(handle, CUBLAS_POINTER_MODE_HOST));
  }
  cudaStream_t stream = current_stream(device);
  DPT_CUBLAS_CHECK(cublasSetStream(handle, stream));
  // cublasSetStream resets the workspace to cuBLAS's own default; hand it ours from the pool instead.
  size_t bytes = 0;
  void* workspace = gemm_workspace(stream, device, &bytes);
  DPT_CUBLAS_CHECK(cublasSetWorkspace(handle, workspace, bytes));
  return handle;
}

cublasLtHandle_t cublaslt_handle(int device) {
  device = resolve_device(device);
  std::lock_guard<std::mutex> lock(g_lt_mutex);
  if (!g_lt_handles[device]) {
    DeviceGuard guard(device);
    DPT_CUBLAS_CHECK(cublasLtCreate(&g_lt_handles[device]));
  }
  return g_lt_handles[device];
}

cudnnHandle_t cudnn_handle(int device) {
  device = resolve_device(device);
  cudnnHandle_t& handle = t_handles.cudnn[device];
  if (!handle) {
    DeviceGuard guard(device);
    DPT_CUDNN_CHECK(cudnnCreate(&handle));
  }
  DPT_CUDNN_CHECK(cudnnSetStream(handle, current_stream(device)));
  return handle;
}

void* gemm_workspace(cudaStream_t stream, int device, size_t* nbytes) {
  device = resolve_device(device);
  *nbytes = kGemmWorkspaceBytes;
  std::lock_guard<std::mutex> lock(g_workspace_mutex);
  void*& ptr = g_workspaces[{device, stream}];
  if (!ptr) {
    // Taken from the pool but not counted as tensor memory; kept for the life of the process. The
    // synchronisation makes the block usable from any stream afterwards (it is allocated only once).
    DeviceGuard guard(device);
    DPT_CUDA_CHECK(cudaMallocAsync(&ptr, kGemmWorkspaceBytes, stream));
    DPT_CUDA_CHECK(cudaStreamSynchronize(stream));
  }
  return ptr;
}

void set_allow_tf32(bool allow) { g_allow_tf32.store(allow, std::memory_order_relaxed); }
bool allow_tf32() { return g_allow_tf32.load(std::memory_order_relaxed); }

}  // namespace dpt::cuda
