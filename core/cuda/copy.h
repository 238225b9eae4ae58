#pragma once
// Raw byte copies that involve a CUDA device (host<->device, device<->device).
#include <cstddef>

#include "core/device.h"

namespace dpt::cuda_kernels {

// Issued on the current stream of the CUDA side (for device<->device, on the source device's stream,
// ordered after the destination's current stream and before its later work via events). When the host
// is involved the stream is synchronised before returning, so the host buffer may be reused or read.
void copy_between_devices(void* dst, Device dst_device, const void* src, Device src_device, size_t nbytes);

}  // namespace dpt::cuda_kernels
