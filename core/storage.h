#pragma once
// A block of memory on one device. CUDA blocks come from the stream-ordered pool (see cuda_runtime.h):
// they are allocated and freed on the device's current stream, so a block freed while a kernel on that
// stream still reads it is only reused by work ordered after that kernel.
#include <cstddef>
#include <memory>

#include "core/device.h"

namespace dpt {

class Storage {
 public:
  Storage(size_t nbytes, Device device);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return data_; }
  size_t nbytes() const { return nbytes_; }
  Device device() const { return device_; }

 private:
  void* data_ = nullptr;
  size_t nbytes_ = 0;
  Device device_;
};

}  // namespace dpt
