#include <array>
#include <atomic>

#include "core/cuda/kernel_utils.cuh"
#include "core/cuda_runtime.h"

namespace dpt::cuda_kernels {

int sm_count(int device) {
  // Cached per device: cudaDeviceGetAttribute is cheap but not free, and this runs on every launch.
  static std::array<std::atomic<int>, 64> counts{};
  DPT_CHECK(device >= 0 && device < 64, "sm_count: bad CUDA device {}", device);
  int n = counts[device].load(std::memory_order_relaxed);
  if (n == 0) {
    DPT_CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device));
    counts[device].store(n, std::memory_order_relaxed);
  }
  return n;
}

}  // namespace dpt::cuda_kernels

namespace dpt::cuda_kernels {

DeviceBuffer::DeviceBuffer(size_t nbytes, int device)
    : ptr_(cuda::allocate(nbytes, device)), nbytes_(nbytes), device_(device) {}

DeviceBuffer::~DeviceBuffer() { cuda::deallocate(ptr_, nbytes_, device_); }

}  // namespace dpt::cuda_kernels
