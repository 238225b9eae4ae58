// HeldStreamTimer (core/cuda_runtime.h): a host function holds the stream; events around the held
// region time it once released.
#include <atomic>
#include <chrono>
#include <thread>

#include "core/cuda/check.h"
#include "core/cuda/stream.h"
#include "core/cuda_runtime.h"
#include "core/error.h"

namespace dpt::cuda {

struct HeldStreamTimer::State {
  CudaEvent start{true}, end{true};
  std::atomic<bool> released{false};
  std::atomic<bool> gave_up{false};
  cudaStream_t stream = nullptr;
};

namespace {

constexpr auto kHoldLimit = std::chrono::seconds(5);

// Runs on CUDA's host-callback thread: it may block, but must not call CUDA.
void CUDART_CB wait_for_release(void* arg) {
  auto* s = static_cast<HeldStreamTimer::State*>(arg);
  const auto deadline = std::chrono::steady_clock::now() + kHoldLimit;
  while (!s->released.load(std::memory_order_acquire)) {
    if (std::chrono::steady_clock::now() > deadline) {
      s->gave_up.store(true);
      return;
    }
    std::this_thread::yield();
  }
}

}  // namespace

HeldStreamTimer::HeldStreamTimer() : state_(std::make_unique<State>()) {}

HeldStreamTimer::~HeldStreamTimer() {
  if (!state_->stream) return;
  state_->released.store(true, std::memory_order_release);  // never leave the stream blocked
  (void)cudaStreamSynchronize(state_->stream);
}

void HeldStreamTimer::hold() {
  DPT_CHECK(!state_->stream, "HeldStreamTimer: hold() twice without release_ms()");
  state_->stream = current_stream();
  state_->released.store(false);
  state_->gave_up.store(false);
  DPT_CUDA_CHECK(cudaLaunchHostFunc(state_->stream, wait_for_release, state_.get()));
  state_->start.record(state_->stream);
}

double HeldStreamTimer::release_ms() {
  DPT_CHECK(state_->stream, "HeldStreamTimer: release_ms() without hold()");
  state_->end.record(state_->stream);
  state_->released.store(true, std::memory_order_release);
  state_->end.synchronize();
  state_->stream = nullptr;
  DPT_CHECK(!state_->gave_up.load(),
            "HeldStreamTimer: the held region waited for the device from the host "
            "(or queued more work than the stream holds) and the hold gave up after {} s: no GPU time to report",
            kHoldLimit.count());
  return state_->start.elapsed_ms(state_->end);
}

}  // namespace dpt::cuda
