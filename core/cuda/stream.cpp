#include "core/cuda/stream.h"

#include <array>
#include <atomic>
#include <mutex>
#include <utility>

#include "core/cuda/check.h"
#include "core/cuda_runtime.h"

namespace dpt::cuda {

namespace {

constexpr int kMaxDevices = 64;

// The default streams live for the whole process (never destroyed: other static destructors may still
// free memory on them at exit).
std::array<std::atomic<cudaStream_t>, kMaxDevices> g_default_streams{};
std::mutex g_default_streams_mutex;

// nullptr entries mean "the default stream of that device".
thread_local std::array<cudaStream_t, kMaxDevices> t_current_streams{};

int resolve_device(int device) {
  if (device < 0) DPT_CUDA_CHECK(cudaGetDevice(&device));
  DPT_CHECK(device < kMaxDevices, "CUDA device {} is beyond the {} devices dptrain supports", device, kMaxDevices);
  return device;
}

}  // namespace

cudaStream_t default_stream(int device) {
  device = resolve_device(device);
  cudaStream_t stream = g_default_streams[device].load(std::memory_order_acquire);
  if (stream) return stream;
  std::lock_guard<std::mutex> lock(g_default_streams_mutex);
  stream = g_default_streams[device].load(std::memory_order_relaxed);
  if (!stream) {
    stream = create_stream(device, 0);
    g_default_streams[device].store(stream, std::memory_order_release);
  }
  return stream;
}

cudaStream_t current_stream(int device) {
  device = resolve_device(device);
  cudaStream_t stream = t_current_streams[device];
  return stream ? stream : default_stream(device);
}

bool stream_is_capturing(cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  DPT_CUDA_CHECK(cudaStreamIsCapturing(stream, &status));
  return status == cudaStreamCaptureStatusActive;
}

cudaStream_t create_stream(int device, int priority) {
  DeviceGuard guard(device);
  int least = 0, greatest = 0;
  DPT_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  // Clamp into the device's range: greatest is the most urgent (numerically smallest).
  if (priority < greatest) priority = greatest;
  if (priority > least) priority = least;
  cudaStream_t stream = nullptr;
  DPT_CUDA_CHECK(cudaStreamCreateWithPriority(&stream, cudaStreamNonBlocking, priority));
  return stream;
}

// --- DeviceGuard --------------------------------------------------------------------------------

DeviceGuard::DeviceGuard(int device) : device_(device) {
  DPT_CUDA_CHECK(cudaGetDevice(&previous_));
  if (device_ >= 0 && device_ != previous_) DPT_CUDA_CHECK(cudaSetDevice(device_));
}

DeviceGuard::~DeviceGuard() {
  // Restoring cannot usefully throw from a destructor; a failure here would already have failed above.
  if (device_ >= 0 && device_ != previous_) (void)cudaSetDevice(previous_);
}

// --- StreamGuard --------------------------------------------------------------------------------

StreamGuard::StreamGuard(cudaStream_t stream) {
  int device = -1;
  if (stream) DPT_CUDA_CHECK(cudaStreamGetDevice(stream, &device));
  device_ = resolve_device(device);
  previous_ = t_current_streams[device_];
  t_current_streams[device_] = stream;
}

StreamGuard::StreamGuard(cudaStream_t stream, int device) : device_(resolve_device(device)) {
  previous_ = t_current_streams[device_];
  t_current_streams[device_] = stream;
}

StreamGuard::~StreamGuard() { t_current_streams[device_] = previous_; }

// --- CudaEvent ----------------------------------------------------------------------------------

CudaEvent::CudaEvent(bool timing, int device) {
  device_ = resolve_device(device);
  DeviceGuard guard(device_);
  DPT_CUDA_CHECK(cudaEventCreateWithFlags(&event_, timing ? cudaEventDefault : cudaEventDisableTiming));
}

CudaEvent::~CudaEvent() {
  if (event_) (void)cudaEventDestroy(event_);
}

CudaEvent::CudaEvent(CudaEvent&& other) noexcept
    : event_(std::exchange(other.event_, nullptr)), device_(other.device_) {}

CudaEvent& CudaEvent::operator=(CudaEvent&& other) noexcept {
  if (this != &other) {
    if (event_) (void)cudaEventDestroy(event_);
    event_ = std::exchange(other.event_, nullptr);
    device_ = other.device_;
  }
  return *this;
}

void CudaEvent::record(cudaStream_t stream) {
  DeviceGuard guard(device_);
  DPT_CUDA_CHECK(cudaEventRecord(event_, stream ? stream : current_stream(device_)));
}

void CudaEvent::wait(cudaStream_t stream) {
  DPT_CUDA_CHECK(cudaStreamWaitEvent(stream ? stream : current_stream(device_), event_, 0));
}

void CudaEvent::wait_external(cudaStream_t stream) {
  cudaStream_t s = stream ? stream : current_stream(device_);
  DPT_CUDA_CHECK(cudaStreamWaitEvent(s, event_, stream_is_capturing(s) ? cudaEventWaitExternal : cudaEventWaitDefault));
}

bool CudaEvent::query() const {
  cudaError_t status = cudaEventQuery(event_);
  if (status == cudaErrorNotReady) {
    (void)cudaGetLastError();  // not-ready is not an error; keep it out of the next launch check
    return false;
  }
  DPT_CUDA_CHECK(status);
  return true;
}

void CudaEvent::synchronize() const { DPT_CUDA_CHECK(cudaEventSynchronize(event_)); }

float CudaEvent::elapsed_ms(const CudaEvent& end) const {
  float ms = 0;
  DPT_CUDA_CHECK(cudaEventElapsedTime(&ms, event_, end.event_));
  return ms;
}

}  // namespace dpt::cuda
