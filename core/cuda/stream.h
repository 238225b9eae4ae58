#pragma once
// Streams and events. Every kernel, copy, allocation and free of a device is issued on that device's
// *current stream*, a thread-local choice. Unless a thread chose otherwise, the current stream is the
// device's default stream: one non-blocking stream per device, created on first use and shared by all
// threads. It is deliberately not the legacy NULL stream, which synchronises with every other stream
// and cannot be captured into a CUDA graph.
#include <cuda_runtime.h>

namespace dpt::cuda {

// The calling thread's current stream on `device` (-1: the current device).
cudaStream_t current_stream(int device = -1);
// The per-device default stream described above (created on first call).
cudaStream_t default_stream(int device = -1);
// True while `stream` is being captured into a CUDA graph: work enqueued now is recorded, not run.
bool stream_is_capturing(cudaStream_t stream);
// A new non-blocking stream on `device` (lower priority numbers run first; 0 is the default priority).
// The caller owns it and destroys it with destroy_stream.
cudaStream_t create_stream(int device, int priority = 0);
// Returns the blocks the allocator cached for `stream` to the pool, then destroys the stream: a later
// stream may get the same handle, and must not inherit blocks whose last use it is not ordered after.
void destroy_stream(cudaStream_t stream);

// Makes `device` current for the guard's lifetime, restoring the previous device after.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;
  int device_ = -1;
};

// Makes `stream` this thread's current stream (on its device) for the guard's lifetime.
class StreamGuard {
 public:
  explicit StreamGuard(cudaStream_t stream);
  // With the stream's device given: the only form allowed while `stream` is being captured into a CUDA
  // graph (the runtime refuses to look a capturing stream's device up).
  StreamGuard(cudaStream_t stream, int device);
  ~StreamGuard();
  StreamGuard(const StreamGuard&) = delete;
  StreamGuard& operator=(const StreamGuard&) = delete;

 private:
  int device_ = 0;
  cudaStream_t previous_ = nullptr;
};

// An owned cudaEvent_t on one device. Timing is off unless asked for (cheaper to record and wait on).
class CudaEvent {
 public:
  explicit CudaEvent(bool timing = false, int device = -1);
  ~CudaEvent();
  CudaEvent(CudaEvent&& other) noexcept;
  CudaEvent& operator=(CudaEvent&& other) noexcept;
  CudaEvent(const CudaEvent&) = delete;
  CudaEvent& operator=(const CudaEvent&) = delete;

  void record(cudaStream_t stream = nullptr);    // nullptr: the current stream of the event's device
  void wait(cudaStream_t stream = nullptr);      // makes `stream` wait for the last record (no host sync)
  // As wait(), for a record made outside any graph being captured: while `stream` is being captured the
  // graph gets an event-wait node, so each replay waits for the record last made before it runs.
  void wait_external(cudaStream_t stream = nullptr);
  bool query() const;                            // true when the recorded work has finished
  void synchronize() const;                      // blocks the host until the recorded work has finished
  float elapsed_ms(const CudaEvent& end) const;  // from this event to `end`; both need timing = true
  cudaEvent_t get() const { return event_; }

 private:
  cudaEvent_t event_ = nullptr;
  int device_ = 0;
};

}  // namespace dpt::cuda
