#pragma once
// Device memory of a captured CUDA graph (core/cuda/graph.h), the allocator's side of capture.
//
// A captured graph replays its kernels on the addresses they were captured with, so every block the
// capture allocates must stay reserved for the graph as long as the graph lives, and must never be handed
// to work outside it. While a thread captures, cuda::allocate serves it from the capture's GraphMemory
// instead of the allocator's block cache: free lists over blocks taken from the device's pool and kept
// until the graph is gone. A block freed during the capture serves a later request of the capture (the
// captured work runs in the order it was enqueued on one stream, the same rule as the block cache). A
// request takes the smallest free piece that holds it; a piece more than twice the request is split, the
// rest staying free, and a freed piece merges with free neighbours of the same block. So a large block a
// step frees (GPT-2's logits) serves the transient requests after it (an attention workspace) instead of
// the graph taking new blocks for them: the graph's memory stays near the eager step's peak. After the
// capture, pieces still held by tensors (the step's loss, say) remain the graph's: each replay rewrites
// them, and when such a tensor dies its piece goes back to the free list, not the pool.
//
// A block allocated before the capture and freed during it may have been read by captured work, which
// every replay reads again: it is kept aside until the graph is gone instead of going back to the pool.
#include <cuda_runtime.h>

#include <cstddef>
#include <map>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace dpt::cuda {

class GraphMemory {
 public:
  explicit GraphMemory(int device);
  ~GraphMemory();  // frees every block; the graph using them must be gone and its work finished
  GraphMemory(const GraphMemory&) = delete;
  GraphMemory& operator=(const GraphMemory&) = delete;

  int device() const { return device_; }
  void* take(size_t bytes);  // `bytes` already rounded by the caller
  bool owns(void* ptr) const;
  void give_back(void* ptr);                                      // a block of ours, free again
  void keep_aside(void* ptr, size_t bytes, cudaStream_t stream);  // a block from before the capture
  size_t reserved_bytes() const;                                  // every block ever taken from the pool
  size_t outstanding_bytes() const;                               // of those, held by live tensors
  void wait_for_blocks();                                         // the blocks taken so far are usable on any stream

 private:
  struct Aside {
    void* ptr;
    size_t bytes;
    cudaStream_t stream;
  };
  // A run of one block's bytes: the blocks are tiled by pieces, each handed out or free.
  struct Piece {
    size_t bytes;
    char* block;
    bool free;
  };
  void add_free(char* ptr, size_t bytes);
  void remove_free(char* ptr, size_t bytes);

  int device_;
  cudaStream_t stream_ = nullptr;  // where blocks come from the device's pool and go back to it
  mutable std::mutex mutex_;
  std::unordered_map<void*, size_t> blocks_;   // every block taken from the pool and its size
  std::map<char*, Piece> pieces_;              // every piece, by address
  std::map<size_t, std::vector<char*>> free_;  // size -> free pieces, the most recently freed last
  std::vector<Aside> aside_;
  size_t reserved_ = 0, outstanding_ = 0;
};

// The GraphMemory the calling thread is capturing into, or nullptr.
GraphMemory* capturing_graph_memory();
// Sets (or, with nullptr, clears) the calling thread's capture target and registers `memory` so that
// blocks of it freed later, on any thread, find their way back to it.
void begin_graph_memory_capture(const std::shared_ptr<GraphMemory>& memory);
void end_graph_memory_capture();
// Called by cuda::deallocate first: true when `ptr` was a graph's block (now back on its free list),
// or was set aside by a capture in progress on this thread.
bool graph_memory_deallocate(void* ptr, size_t bytes, cudaStream_t stream);
// The graph is gone: `memory` is freed as soon as none of its blocks is held by a tensor any more.
void retire_graph_memory(const std::shared_ptr<GraphMemory>& memory);

}  // namespace dpt::cuda
