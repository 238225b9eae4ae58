// The CUDA runtime of a build without CUDA: no devices, and a clear error if asked for one.
#include "core/cuda_runtime.h"
#include "core/device_stream.h"
#include "core/error.h"

namespace dpt::cuda {

namespace {
[[noreturn]] void no_cuda() { DPT_FAIL("this dptrain was built without CUDA (DPT_CUDA=OFF or no nvcc)"); }
}  // namespace

bool is_available() { return false; }
int device_count() { return 0; }
int current_device() { return 0; }
void set_device(int) { no_cuda(); }
void synchronize() {}
std::string device_name(int) { no_cuda(); }
void* allocate(size_t, int) { no_cuda(); }
void deallocate(void*, size_t, int) {}
size_t free_memory(int) { no_cuda(); }
size_t total_memory(int) { no_cuda(); }
size_t memory_allocated(int) { return 0; }
size_t max_memory_allocated(int) { return 0; }
void reset_peak_memory_stats(int) {}
void* allocate_pinned(size_t) { no_cuda(); }
void free_pinned(void*) {}
void copy_to_host_async(void*, const void*, size_t) { no_cuda(); }

struct CudaGraph::State {};
CudaGraph::CudaGraph() { no_cuda(); }
CudaGraph::~CudaGraph() = default;
void CudaGraph::capture(const std::function<void()>&) { no_cuda(); }
void CudaGraph::replay() { no_cuda(); }
size_t CudaGraph::memory_reserved() const { return 0; }
size_t CudaGraph::memory_outstanding() const { return 0; }

struct HeldStreamTimer::State {};
HeldStreamTimer::HeldStreamTimer() { no_cuda(); }
HeldStreamTimer::~HeldStreamTimer() = default;
void HeldStreamTimer::hold() { no_cuda(); }
double HeldStreamTimer::release_ms() { no_cuda(); }

}  // namespace dpt::cuda

namespace dpt {

// No side streams or events without CUDA (core/device_stream.h): the host's order is the only one.
SideStream::SideStream(Device device) : device_(device) {}
SideStream::~SideStream() = default;
struct SideStreamGuard::State {};
SideStreamGuard::SideStreamGuard(const SideStream&) {}
SideStreamGuard::~SideStreamGuard() = default;
struct StreamEvent::State {};
StreamEvent::StreamEvent(Device, bool) {}
StreamEvent::~StreamEvent() = default;
StreamEvent::StreamEvent(StreamEvent&&) noexcept = default;
StreamEvent& StreamEvent::operator=(StreamEvent&&) noexcept = default;
void StreamEvent::record() {}
void StreamEvent::record(const SideStream&) {}
void StreamEvent::wait() {}
void StreamEvent::wait(const SideStream&) {}
void StreamEvent::wait_external() {}
void StreamEvent::synchronize() const {}
float StreamEvent::elapsed_ms(const StreamEvent&) const { return 0.0f; }

}  // namespace dpt
