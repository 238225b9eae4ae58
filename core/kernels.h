#pragma once
// The backend interface: every op in ops.h reduces to these kernels. Each has a CPU implementation
// (core/cpu/, Eigen where it pays) and a CUDA one (core/cuda/); the functions below pick by device.
#include <cstddef>

#include "core/kernel_types.h"
#include "core/tensor.h"

namespace dpt::kernels {
#include "core/kernel_decls.inc"

// Raw copy of nbytes between devices (host<->device, device<->device); returns when the host may
// reuse or read its buffer.
void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, size_t nbytes);
}  // namespace dpt::kernels
