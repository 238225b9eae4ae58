#include "core/cuda/graph_memory.h"

#include <algorithm>
#include <atomic>

#include "core/cuda/check.h"
#include "core/cuda/stream.h"

namespace dpt::cuda {

GraphMemory::GraphMemory(int device) : device_(device) {
  DeviceGuard guard(device_);
  DPT_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
}

GraphMemory::~GraphMemory() {
  DeviceGuard guard(device_);
  (void)cudaDeviceSynchronize();  // the last replay may still be running
  for (const auto& [ptr, bytes] : blocks_) (void)cudaFreeAsync(ptr, stream_);
  for (const Aside& a : aside_) (void)cudaFreeAsync(a.ptr, a.stream);
  (void)cudaStreamSynchronize(stream_);
  (void)cudaStreamDestroy(stream_);
}

void GraphMemory::wait_for_blocks() { DPT_CUDA_CHECK(cudaStreamSynchronize(stream_)); }

void GraphMemory::add_free(char* ptr, size_t bytes) { free_[bytes].push_back(ptr); }

void GraphMemory::remove_free(char* ptr, size_t bytes) {
  auto it = free_.find(bytes);
  std::erase(it->second, ptr);
  if (it->second.empty()) free_.erase(it);
}

void* GraphMemory::take(size_t bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = free_.lower_bound(bytes);
  if (it != free_.end()) {
    const size_t size = it->first;
    char* ptr = it->second.back();  // the most recently freed: likeliest still in L2
    it->second.pop_back();
    if (it->second.empty()) free_.erase(it);
    Piece& piece = pieces_.at(ptr);
    piece.free = false;
    if (size > 2 * bytes) {  // split: the front serves the request, the rest stays free
      piece.bytes = bytes;
      pieces_.emplace(ptr + bytes, Piece{size - bytes, piece.block, true});
      add_free(ptr + bytes, size - bytes);
    }
    outstanding_ += piece.bytes;
    return ptr;
  }
  // From the device's pool on our own stream, which is not being captured: the block exists now, not as
  // a node of the graph, and may be one the eager warm-up steps left cached. The graph's work uses it
  // only after wait_for_blocks (at the end of the capture).
  DeviceGuard guard(device_);
  void* block = nullptr;
  DPT_CUDA_CHECK(cudaMallocAsync(&block, bytes, stream_));
  blocks_.emplace(block, bytes);
  char* ptr = static_cast<char*>(block);
  pieces_.emplace(ptr, Piece{bytes, ptr, false});
  reserved_ += bytes;
  outstanding_ += bytes;
  return ptr;
}

bool GraphMemory::owns(void* ptr) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = pieces_.find(static_cast<char*>(ptr));
  return it != pieces_.end() && !it->second.free;
}

void GraphMemory::give_back(void* p) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = pieces_.find(static_cast<char*>(p));
  outstanding_ -= it->second.bytes;
  it->second.free = true;
  // Merge with the free pieces on either side that belong to the same block (a block's pieces are
  // adjacent in the address order; another block's never are, even when its bytes happen to follow).
  auto next = std::next(it);
  if (next != pieces_.end() && next->second.free && next->second.block == it->second.block) {
    remove_free(next->first, next->second.bytes);
    it->second.bytes += next->second.bytes;
    pieces_.erase(next);
  }
  if (it != pieces_.begin()) {
    auto prev = std::prev(it);
    if (prev->second.free && prev->second.block == it->second.block) {
      remove_free(prev->first, prev->second.bytes);
      prev->second.bytes += it->second.bytes;
      pieces_.erase(it);
      it = prev;
    }
  }
  add_free(it->first, it->second.bytes);
}

void GraphMemory::keep_aside(void* ptr, size_t bytes, cudaStream_t stream) {
  std::lock_guard<std::mutex> lock(mutex_);
  aside_.push_back({ptr, bytes, stream});
}

size_t GraphMemory::reserved_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return reserved_;
}

size_t GraphMemory::outstanding_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return outstanding_;
}

namespace {

thread_local std::shared_ptr<GraphMemory> t_capturing;

// Graph memories that may still own blocks held by tensors: live graphs, and retired ones waiting for
// their last block. Usually empty, so deallocate's check is one relaxed load. Never destroyed: tensors
// freed by other static destructors at exit still ask it.
struct Registry {
  std::mutex mutex;
  std::vector<std::shared_ptr<GraphMemory>> live, retired;
  std::atomic<size_t> count{0};

  void recount() { count.store(live.size() + retired.size(), std::memory_order_relaxed); }
  void sweep_retired() {
    std::erase_if(retired, [](const std::shared_ptr<GraphMemory>& m) { return m->outstanding_bytes() == 0; });
    recount();
  }
};

Registry& registry() {
  static Registry* r = new Registry;
  return *r;
}

}  // namespace

GraphMemory* capturing_graph_memory() { return t_capturing.get(); }

void begin_graph_memory_capture(const std::shared_ptr<GraphMemory>& memory) {
  DPT_CHECK(!t_capturing, "CUDA graph capture: this thread is already capturing");
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  if (std::find(r.live.begin(), r.live.end(), memory) == r.live.end()) r.live.push_back(memory);
  r.recount();
  t_capturing = memory;
}

void end_graph_memory_capture() { t_capturing.reset(); }

bool graph_memory_deallocate(void* ptr, size_t bytes, cudaStream_t stream) {
  Registry& r = registry();
  if (r.count.load(std::memory_order_relaxed) == 0 && !t_capturing) return false;
  std::lock_guard<std::mutex> lock(r.mutex);
  for (auto* list : {&r.live, &r.retired}) {
    for (const auto& m : *list) {
      if (!m->owns(ptr)) continue;
      m->give_back(ptr);
      if (list == &r.retired) r.sweep_retired();  // may free the whole memory
      return true;
    }
  }
  if (t_capturing) {
    t_capturing->keep_aside(ptr, bytes, stream);
    return true;
  }
  return false;
}

void retire_graph_memory(const std::shared_ptr<GraphMemory>& memory) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  std::erase(r.live, memory);
  r.retired.push_back(memory);
  r.sweep_retired();
}

}  // namespace dpt::cuda
