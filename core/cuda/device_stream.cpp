// The CUDA build's side streams and events (core/device_stream.h): CUDA devices get core/cuda/stream.h's
// streams and events, CPU devices nothing.
#include "core/device_stream.h"

#include <optional>

#include "core/cuda/stream.h"

namespace dpt {

namespace {
cudaStream_t as_stream(void* handle) { return static_cast<cudaStream_t>(handle); }
}  // namespace

SideStream::SideStream(Device device) : device_(device) {
  if (device_.is_cuda()) stream_ = cuda::create_stream(device_.index);
}

SideStream::~SideStream() {
  if (stream_) cuda::destroy_stream(as_stream(stream_));
}

struct SideStreamGuard::State {
  cuda::StreamGuard guard;
  State(cudaStream_t stream, int device) : guard(stream, device) {}
};

SideStreamGuard::SideStreamGuard(const SideStream& stream) {
  if (stream.handle()) state_ = std::make_unique<State>(as_stream(stream.handle()), stream.device().index);
}

SideStreamGuard::~SideStreamGuard() = default;

struct StreamEvent::State {
  cuda::CudaEvent event;
  State(bool timing, int device) : event(timing, device) {}
};

StreamEvent::StreamEvent(Device device, bool timing) {
  if (device.is_cuda()) state_ = std::make_unique<State>(timing, device.index);
}

StreamEvent::~StreamEvent() = default;
StreamEvent::StreamEvent(StreamEvent&& other) noexcept = default;
StreamEvent& StreamEvent::operator=(StreamEvent&& other) noexcept = default;

void StreamEvent::record() {
  if (state_) state_->event.record();
}

void StreamEvent::record(const SideStream& stream) {
  if (state_) state_->event.record(as_stream(stream.handle()));
}

void StreamEvent::wait() {
  if (state_) state_->event.wait();
}

void StreamEvent::wait_external() {
  if (state_) state_->event.wait_external();
}

void StreamEvent::wait(const SideStream& stream) {
  if (state_) state_->event.wait(as_stream(stream.handle()));
}

void StreamEvent::synchronize() const {
  if (state_) state_->event.synchronize();
}

float StreamEvent::elapsed_ms(const StreamEvent& end) const {
  return state_ && end.state_ ? state_->event.elapsed_ms(end.state_->event) : 0.0f;
}

}  // namespace dpt
