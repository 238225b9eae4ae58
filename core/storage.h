#pragma once
// A block of memory on one device. CUDA blocks come from the stream-ordered pool (see cuda_runtime.h):
// they are allocated and freed on the device's current stream, so a block freed while a kernel on that
// stream still reads it is only reused by work ordered after that kernel.
#include <cstddef>
#include <functional>
#include <memory>

#include "core/device.h"

namespace dpt {

class Storage {
 public:
  Storage(size_t nbytes, Device device);
  // Adopts memory allocated elsewhere (e.g. a cudaMalloc block other processes map through CUDA IPC,
  // which the stream-ordered pool cannot export); `release` runs once, when the last tensor lets go.
  Storage(void* data, size_t nbytes, Device device, std::function<void(void*)> release);
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
  std::function<void(void*)> release_;  // set for adopted memory only
};

}  // namespace dpt
