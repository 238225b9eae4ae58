#pragma once
// A coarse kernel profiler for finding where a training step spends its time. Off unless the
// environment sets DPT_PROFILE_KERNELS=1; then every kernel call through the dispatcher (and the fused
// ops) synchronises the device before and after, so the host clock measures that kernel alone, and a
// table of total time per kernel name is printed when the process exits. Synchronising changes the
// overlap of a real step: use it to rank kernels, never to time a step.
#include <string>

namespace dpt {

class KernelTimer {
 public:
  KernelTimer(const char* name, bool on_cuda);
  ~KernelTimer();
  KernelTimer(const KernelTimer&) = delete;
  KernelTimer& operator=(const KernelTimer&) = delete;

  static bool enabled();

 private:
  const char* name_ = nullptr;  // null when not timing
  double start_ = 0;
};

}  // namespace dpt
