// Device properties for logs and MFU.
#include <cuda_runtime.h>

#include "core/cuda/check.h"
#include "core/cuda_runtime.h"

namespace dpt::cuda {

std::string device_name(int device) {
  cudaDeviceProp prop{};
  DPT_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  return prop.name;
}

}  // namespace dpt::cuda
