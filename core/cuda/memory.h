#pragma once
// Allocator introspection beyond core/cuda_runtime.h (which counts bytes held by live tensors): what
// the device's stream-ordered pool itself holds. No CUDA types, so tests built without CUDA may include
// it behind DPT_HAVE_CUDA without pulling in the toolkit.
#include <cstddef>

namespace dpt::cuda {

// Bytes the device's default memory pool has reserved from the driver (live blocks plus cached free
// ones). Because the pool's release threshold is "keep everything", this only grows when a request
// cannot be served from blocks already cached.
size_t pool_reserved_bytes(int device);
// Returns cached, unused memory (the host-side block cache, then the pool) to the driver, after
// synchronising the device.
void empty_cache(int device);

}  // namespace dpt::cuda
