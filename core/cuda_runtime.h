#pragma once
// Host-side view of the CUDA runtime that CPU-only code may include: no CUDA headers here. In a build
// without CUDA these report no device and throw if asked to do device work.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

namespace dpt::cuda {

bool is_available();  // any error from the driver (none installed, no device) counts as "no GPU"
int device_count();
int current_device();
void set_device(int device);
void synchronize();                   // the current device
std::string device_name(int device);  // "NVIDIA H100 80GB HBM3"

// Stream-ordered pool (cudaMallocAsync on the current stream, release threshold = keep everything).
void* allocate(size_t nbytes, int device);
void deallocate(void* ptr, size_t nbytes, int device);
// Bytes the driver can still hand out on `device` (cudaMemGetInfo's free), and the device's total.
size_t free_memory(int device);
size_t total_memory(int device);
size_t memory_allocated(int device);      // bytes held by live tensors
size_t max_memory_allocated(int device);  // peak of the above since the last reset
void reset_peak_memory_stats(int device);

// Page-locked host memory, for asynchronous host-to-device copies (data loader).
void* allocate_pinned(size_t nbytes);
void free_pinned(void* ptr);
// Copies nbytes of device memory to host memory (page-locked, for the copy to be asynchronous) on the
// current stream, behind the work already there; returns without waiting.
void copy_to_host_async(void* host, const void* device_ptr, size_t nbytes);

// A CUDA graph of work enqueued on the current stream: capture() runs `work` on the host once while the
// stream records its kernels instead of running them; each replay() then enqueues all of them with one
// launch, so the host's per-kernel cost (dispatch, autograd, allocation, launches) is paid once instead
// of every step. Whatever `work` computes on the host is frozen at capture: hyperparameters that change
// between replays must be read by the kernels from device memory (Adam::count_steps_on_device), and the
// work must not synchronise with the device. Memory the capture allocates belongs to the graph (core/
// cuda/graph_memory.h): tensors created by `work` and still alive afterwards (a step's loss) are
// rewritten by every replay. Other streams take part only by forking from the current stream and joining
// back into it through events before capture() returns (DDP's communication stream does).
class CudaGraph {
 public:
  CudaGraph();
  ~CudaGraph();
  CudaGraph(const CudaGraph&) = delete;
  CudaGraph& operator=(const CudaGraph&) = delete;

  void capture(const std::function<void()>& work);
  void replay();
  size_t memory_reserved() const;     // bytes the graph's memory holds, in use or free
  size_t memory_outstanding() const;  // of those, held by tensors alive outside the graph

  struct State;

 private:
  std::unique_ptr<State> state_;
};

// The GPU time of the work enqueued on the current stream between hold() and release_ms(), with the
// host out of the way. hold() makes the stream wait for the host (a host function that blocks until
// release), so everything enqueued meanwhile then runs back to back; a wall-clock time of the same work
// minus this one is the time the GPU sat idle waiting for launches. A region that synchronises the host
// with the device would wait for the hold itself, so the hold gives up after a few seconds and
// release_ms() reports that as an error instead of a time. Diagnostics (dpt-bench train --held).
class HeldStreamTimer {
 public:
  HeldStreamTimer();
  ~HeldStreamTimer();
  HeldStreamTimer(const HeldStreamTimer&) = delete;
  HeldStreamTimer& operator=(const HeldStreamTimer&) = delete;

  void hold();
  double release_ms();  // releases the stream, waits for the work, returns its GPU milliseconds

  struct State;

 private:
  std::unique_ptr<State> state_;
};

}  // namespace dpt::cuda
