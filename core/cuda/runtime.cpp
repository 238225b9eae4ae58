// The CUDA runtime of a CUDA build: device discovery, the stream-ordered allocator and pinned memory.
//
// Allocation: every device block comes from the device's default memory pool through cudaMallocAsync on
// the current stream, and goes back with cudaFreeAsync on the current stream. The pool's release
// threshold is UINT64_MAX, so freed blocks stay cached in the pool and the next request of a similar
// size is served without a driver call: this is what makes per-op allocation cheap. Stream ordering
// makes reuse safe: a block freed on stream S is only handed to work ordered after the free on S.
// In front of the pool, a host-side BlockCache (core/block_cache.h) serves repeated sizes on the same
// stream without any driver call; DPT_NO_CUDA_MEMORY_CACHING=1 turns it off (as PyTorch's
// PYTORCH_NO_CUDA_MEMORY_CACHING does), which compute-sanitizer runs want: a cached block is still
// allocated as far as the sanitizer can tell, so a use after free inside it would go unreported.
#include <spdlog/spdlog.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <utility>

#include "core/block_cache.h"
#include "core/cuda/check.h"
#include "core/cuda/graph_memory.h"
#include "core/cuda/memory.h"
#include "core/cuda/stream.h"
#include "core/cuda_runtime.h"
#include "core/flags.h"

namespace dpt::cuda {

namespace {

constexpr int kMaxDevices = 64;

struct MemoryStats {
  std::atomic<size_t> live{0};
  std::atomic<size_t> peak{0};
};
std::array<MemoryStats, kMaxDevices> g_stats;
std::array<std::once_flag, kMaxDevices> g_pool_configured;

// 1 GiB of blocks of at most 64 MiB per device: a small model's whole step fits, a large model's big
// activations go straight back to the pool (one driver call beside milliseconds of kernels). A full
// cache is emptied into the pool (see deallocate), so blocks nobody asks for again cannot pile up.
constexpr size_t kCacheCapacity = size_t{1} << 30;
constexpr size_t kCacheMaxBlock = size_t{64} << 20;

bool caching_enabled() {
  static const bool enabled = !flag_on(Flag::NoCudaMemoryCaching);
  return enabled;
}

// Never destroyed: tensors freed by other static destructors at exit still go through it.
BlockCache& block_cache(int device) {
  static std::array<BlockCache*, kMaxDevices> caches = [] {
    std::array<BlockCache*, kMaxDevices> a{};
    for (auto& c : a) c = new BlockCache(kCacheCapacity, kCacheMaxBlock);
    return a;
  }();
  return *caches[device];
}

// Hands cached blocks back to the pool, each on the stream it was freed on (its ordering point).
void free_blocks(const std::vector<BlockCache::Block>& blocks) {
  for (const auto& b : blocks) {
    (void)cudaFreeAsync(b.ptr, static_cast<cudaStream_t>(const_cast<void*>(b.stream)));
  }
}

int checked_device(int device, const char* what) {
  if (device < 0) DPT_CUDA_CHECK(cudaGetDevice(&device));
  DPT_CHECK(device < device_count(), "{}: CUDA device {} does not exist ({} visible)", what, device, device_count());
  return device;
}

// Keep every freed block cached in the pool rather than returning it to the driver at each sync.
void configure_pool(int device) {
  std::call_once(g_pool_configured[device], [device] {
    cudaMemPool_t pool = nullptr;
    DPT_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, device));
    uint64_t threshold = UINT64_MAX;
    DPT_CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold));
  });
}

void note_allocated(int device, size_t nbytes) {
  MemoryStats& s = g_stats[device];
  size_t now = s.live.fetch_add(nbytes, std::memory_order_relaxed) + nbytes;
  size_t peak = s.peak.load(std::memory_order_relaxed);
  while (now > peak && !s.peak.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
  }
}

}  // namespace

bool is_available() { return device_count() > 0; }

int device_count() {
  // Asked once: without a driver (CI, development machines) cudaGetDeviceCount fails, which means
  // "no GPU" — never an error, and nothing else CUDA is touched afterwards.
  static const int count = [] {
    int n = 0;
    cudaError_t status = cudaGetDeviceCount(&n);
    if (status != cudaSuccess) {
      (void)cudaGetLastError();
      return 0;
    }
    return n;
  }();
  return count;
}

int current_device() {
  if (!is_available()) return 0;
  int device = 0;
  DPT_CUDA_CHECK(cudaGetDevice(&device));
  return device;
}

void set_device(int device) {
  DPT_CHECK(device >= 0 && device < device_count(), "set_device: CUDA device {} does not exist ({} visible)", device,
            device_count());
  DPT_CUDA_CHECK(cudaSetDevice(device));
}

void synchronize() {
  if (!is_available()) return;
  DPT_CUDA_CHECK(cudaDeviceSynchronize());
}

std::string device_name(int device) {
  DPT_CHECK(device >= 0 && device < device_count(), "device_name: CUDA device {} does not exist ({} visible)", device,
            device_count());
  cudaDeviceProp prop{};
  DPT_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  return prop.name;
}

namespace {
// cudaMemGetInfo for `device`, whichever device is current (and stays current).
std::pair<size_t, size_t> memory_info(int device) {
  DPT_CHECK(device >= 0 && device < device_count(), "free_memory: CUDA device {} does not exist ({} visible)", device,
            device_count());
  int current = 0;
  DPT_CUDA_CHECK(cudaGetDevice(&current));
  DPT_CUDA_CHECK(cudaSetDevice(device));
  size_t free = 0, total = 0;
  const cudaError_t status = cudaMemGetInfo(&free, &total);
  DPT_CUDA_CHECK(cudaSetDevice(current));
  DPT_CUDA_CHECK(status);
  return {free, total};
}
}  // namespace

size_t free_memory(int device) { return memory_info(device).first; }
size_t total_memory(int device) { return memory_info(device).second; }

void* allocate(size_t nbytes, int device) {
  device = checked_device(device, "allocate");
  if (nbytes == 0) return nullptr;
  const size_t bytes = BlockCache::round_up(nbytes);
  if (GraphMemory* graph = capturing_graph_memory(); graph && graph->device() == device) {
    void* ptr = graph->take(bytes);  // a CUDA graph is being captured: its memory, never the pool's
    note_allocated(device, nbytes);
    return ptr;
  }
  cudaStream_t stream = current_stream(device);
  void* ptr = caching_enabled() ? block_cache(device).take(stream, bytes) : nullptr;
  if (ptr == nullptr) {
    configure_pool(device);
    DeviceGuard guard(device);
    cudaError_t status = cudaMallocAsync(&ptr, bytes, stream);
    if (status == cudaErrorMemoryAllocation) {
      // Blocks cached for other sizes or streams may be what is missing: give them back and retry once
      // the device has finished with them.
      (void)cudaGetLastError();
      free_blocks(block_cache(device).drain());
      DPT_CUDA_CHECK(cudaDeviceSynchronize());
      status = cudaMallocAsync(&ptr, bytes, stream);
    }
    if (status == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();
      DPT_FAIL("CUDA out of memory on device {}: asked for {} bytes with {} bytes held by live tensors (peak {})",
               device, nbytes, memory_allocated(device), max_memory_allocated(device));
    }
    DPT_CUDA_CHECK(status);
  }
  note_allocated(device, nbytes);
  return ptr;
}

void deallocate(void* ptr, size_t nbytes, int device) {
  // Called from destructors: never throws. At process exit the runtime may already be unloading, in
  // which case the memory is going away anyway.
  if (!ptr) return;
  g_stats[device].live.fetch_sub(nbytes, std::memory_order_relaxed);
  cudaStream_t stream = nullptr;
  try {
    stream = current_stream(device);
  } catch (const std::exception&) {
    stream = nullptr;
  }
  // A CUDA graph's block, or one freed while a graph is captured: neither may go back to the pool.
  if (graph_memory_deallocate(ptr, BlockCache::round_up(nbytes), stream)) return;
  bool flush = false;
  if (stream && caching_enabled()) {
    const BlockCache::Put kept = block_cache(device).put(stream, BlockCache::round_up(nbytes), ptr);
    if (kept == BlockCache::Put::Kept) return;
    // Full means blocks are waiting that no request matches: they all go back to the pool with this one.
    flush = kept == BlockCache::Put::Full;
  }
  int previous = -1;
  if (cudaGetDevice(&previous) != cudaSuccess) return;
  if (previous != device) (void)cudaSetDevice(device);
  if (flush) free_blocks(block_cache(device).drain());
  cudaError_t status = stream ? cudaFreeAsync(ptr, stream) : cudaErrorInvalidResourceHandle;
  if (previous != device) (void)cudaSetDevice(previous);
  if (status != cudaSuccess && status != cudaErrorCudartUnloading && status != cudaErrorContextIsDestroyed) {
    (void)cudaGetLastError();
    spdlog::error("cudaFreeAsync of {} bytes on device {} failed: {}", nbytes, device, cudaGetErrorString(status));
  }
}

void destroy_stream(cudaStream_t stream) {
  if (!stream) return;
  int device = 0;
  if (cudaStreamGetDevice(stream, &device) == cudaSuccess) {
    DeviceGuard guard(device);
    free_blocks(block_cache(device).drain(stream));
  }
  (void)cudaStreamDestroy(stream);
}

size_t memory_allocated(int device) {
  if (!is_available()) return 0;
  return g_stats[checked_device(device, "memory_allocated")].live.load(std::memory_order_relaxed);
}

size_t max_memory_allocated(int device) {
  if (!is_available()) return 0;
  return g_stats[checked_device(device, "max_memory_allocated")].peak.load(std::memory_order_relaxed);
}

void reset_peak_memory_stats(int device) {
  if (!is_available()) return;
  MemoryStats& s = g_stats[checked_device(device, "reset_peak_memory_stats")];
  s.peak.store(s.live.load(std::memory_order_relaxed), std::memory_order_relaxed);
}

size_t pool_reserved_bytes(int device) {
  if (!is_available()) return 0;
  device = checked_device(device, "pool_reserved_bytes");
  cudaMemPool_t pool = nullptr;
  DPT_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, device));
  uint64_t reserved = 0;
  DPT_CUDA_CHECK(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, &reserved));
  return static_cast<size_t>(reserved);
}

void empty_cache(int device) {
  if (!is_available()) return;
  device = checked_device(device, "empty_cache");
  DeviceGuard guard(device);
  free_blocks(block_cache(device).drain());
  DPT_CUDA_CHECK(cudaDeviceSynchronize());
  cudaMemPool_t pool = nullptr;
  DPT_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, device));
  DPT_CUDA_CHECK(cudaMemPoolTrimTo(pool, 0));
}

void* allocate_pinned(size_t nbytes) {
  DPT_CHECK(is_available(), "allocate_pinned: no CUDA device is available");
  if (nbytes == 0) return nullptr;
  void* ptr = nullptr;
  DPT_CUDA_CHECK(cudaMallocHost(&ptr, nbytes));
  return ptr;
}

void copy_to_host_async(void* host, const void* device_ptr, size_t nbytes) {
  DPT_CUDA_CHECK(cudaMemcpyAsync(host, device_ptr, nbytes, cudaMemcpyDeviceToHost, current_stream()));
}

void free_pinned(void* ptr) {
  if (!ptr) return;
  cudaError_t status = cudaFreeHost(ptr);
  if (status != cudaSuccess && status != cudaErrorCudartUnloading) {
    (void)cudaGetLastError();
    spdlog::error("cudaFreeHost failed: {}", cudaGetErrorString(status));
  }
}

}  // namespace dpt::cuda
