#pragma once
// A few float64 values on a device, copied to page-locked host memory behind the work enqueued so far on
// the current stream, for the host to read later: values() waits for that copy alone, not for the work
// enqueued after it. A trainer reads step k's loss this way while step k + 1 runs, so the GPU never idles
// waiting for the host. On the CPU the copy is made at once.
#include <cstdint>
#include <vector>

#include "core/device_stream.h"
#include "core/tensor.h"

namespace dpt {

class HostReadback {
 public:
  HostReadback(Device device, int64_t count);
  ~HostReadback();
  HostReadback(const HostReadback&) = delete;
  HostReadback& operator=(const HostReadback&) = delete;

  // `values`: float64, `count` elements, contiguous, on the device. Replaces any earlier copy.
  void copy(const Tensor& values);
  // The last copy's values, once it has arrived.
  std::vector<double> values() const;

 private:
  Device device_;
  int64_t count_;
  double* host_ = nullptr;  // page-locked on a CUDA device
  std::vector<double> cpu_values_;
  StreamEvent arrived_;
  bool copied_ = false;
};

}  // namespace dpt
