#pragma once
// Side streams and events for code that runs on CPU and CUDA tensors alike (DDP and its bucket
// exchanges): one type whatever the build, so such code needs no #ifdef. On a CUDA device they are a
// cudaStream_t and a cudaEvent_t (core/cuda/stream.h). On the CPU, work runs on the host in issue order,
// which already is every order a stream or an event would impose: there is no side stream, and recording,
// waiting and guards do nothing.
#include <memory>

#include "core/device.h"

namespace dpt {

// An owned non-blocking stream on a CUDA device (core/cuda/stream.h create_stream); none on the CPU.
class SideStream {
 public:
  explicit SideStream(Device device);
  ~SideStream();
  SideStream(const SideStream&) = delete;
  SideStream& operator=(const SideStream&) = delete;

  Device device() const { return device_; }
  void* handle() const { return stream_; }  // the cudaStream_t; nullptr on the CPU

 private:
  Device device_;
  void* stream_ = nullptr;
};

// Makes `stream` its device's current stream for this thread for the guard's lifetime, in the form
// allowed while the stream is being captured into a CUDA graph. Nothing on the CPU.
class SideStreamGuard {
 public:
  explicit SideStreamGuard(const SideStream& stream);
  ~SideStreamGuard();
  SideStreamGuard(const SideStreamGuard&) = delete;
  SideStreamGuard& operator=(const SideStreamGuard&) = delete;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// An event on a device (timing off unless asked for). Without a stream argument, the device's current
// stream. On the CPU every call does nothing and elapsed_ms() is 0.
class StreamEvent {
 public:
  explicit StreamEvent(Device device, bool timing = false);
  ~StreamEvent();
  StreamEvent(StreamEvent&& other) noexcept;
  StreamEvent& operator=(StreamEvent&& other) noexcept;

  void record();
  void record(const SideStream& stream);
  void wait();  // the current stream waits for the last record (no host synchronisation)
  void wait(const SideStream& stream);
  // The current stream waits for the last record, which was made outside any graph being captured; while
  // the current stream is being captured, each replay of the graph waits for the record last made before
  // it runs (a record made each step by eager code, waited on by a replayed step).
  void wait_external();
  void synchronize() const;                        // the host waits for the last record
  float elapsed_ms(const StreamEvent& end) const;  // both with timing on

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace dpt
