#include "core/storage.h"

#include <cstdlib>
#include <new>

#include "core/cuda_runtime.h"
#include "core/error.h"

namespace dpt {

// Host blocks are 64-byte aligned so Eigen's vectorised loads and pinned-copy paths never split lines.
Storage::Storage(size_t nbytes, Device device) : nbytes_(nbytes), device_(device) {
  if (nbytes == 0) return;
  if (device.is_cpu()) {
    data_ = std::aligned_alloc(64, (nbytes + 63) / 64 * 64);
    if (!data_) throw std::bad_alloc();
  } else {
    data_ = cuda::allocate(nbytes, device.index);
  }
}

Storage::Storage(void* data, size_t nbytes, Device device, std::function<void(void*)> release)
    : data_(data), nbytes_(nbytes), device_(device), release_(std::move(release)) {}

Storage::~Storage() {
  if (!data_) return;
  if (release_) {
    release_(data_);
    return;
  }
  if (device_.is_cpu()) {
    std::free(data_);
  } else {
    cuda::deallocate(data_, nbytes_, device_.index);
  }
}

}  // namespace dpt
