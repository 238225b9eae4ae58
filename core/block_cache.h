#pragma once
// A host-side cache of freed device blocks, in front of the stream-ordered pool (core/cuda/runtime.cpp).
//
// Why: cudaMallocAsync and cudaFreeAsync are driver calls of about a microsecond each. A training step
// of a small model allocates and frees a few hundred tensors, all launched from the host faster than the
// GPU runs them only if the host does little else, so those calls are a visible share of the step
// (the tiny GPT). A step allocates the same sizes every time, so most requests can be served from the
// blocks the previous step freed without asking the driver.
//
// Invariant (what makes reuse safe): a block is only handed back out for the stream it was freed on.
// Work on one stream runs in order, so whatever used the block before its free has finished before any
// later work on that stream touches it: the same rule cudaFreeAsync follows. Blocks are matched by exact
// (rounded) size, so no block is split and nothing is copied.
//
// No CUDA types: streams and blocks are opaque pointers, so the policy is unit-tested without a GPU.
#include <cstddef>
#include <mutex>
#include <unordered_map>
#include <utility>
#include <vector>

namespace dpt {

class BlockCache {
 public:
  struct Block {
    const void* stream;
    size_t bytes;
    void* ptr;
  };

  // Holds at most `capacity_bytes` in all, and no single block above `max_block_bytes` (large blocks are
  // few per step, so the driver call is small beside the kernels that use them).
  BlockCache(size_t capacity_bytes, size_t max_block_bytes)
      : capacity_(capacity_bytes), max_block_(max_block_bytes) {}

  // Requests are rounded up to this granularity before they reach either the cache or the pool, so
  // tensors of nearly equal size share blocks.
  static size_t round_up(size_t bytes) { return (bytes + kGranularity - 1) / kGranularity * kGranularity; }

  // A block of exactly `bytes` (already rounded) last freed on `stream`, or nullptr.
  void* take(const void* stream, size_t bytes);
  enum class Put { Kept, TooLarge, Full };
  // Keeps the block for later requests on `stream`, unless it is too large or the cache is full; the
  // caller then frees it itself. On Full the caller drains the cache: blocks that nothing asks for
  // (freed on another stream than the one their size is requested on, say) must not stay forever.
  Put put(const void* stream, size_t bytes, void* ptr);
  // Empties the cache (all streams, or only `stream`) and returns the blocks for the caller to free.
  std::vector<Block> drain();
  std::vector<Block> drain(const void* stream);

  size_t cached_bytes() const;

 private:
  static constexpr size_t kGranularity = 512;
  struct KeyHash {
    size_t operator()(const std::pair<const void*, size_t>& k) const {
      return std::hash<const void*>()(k.first) ^ (std::hash<size_t>()(k.second) * 0x9e3779b97f4a7c15ULL);
    }
  };

  mutable std::mutex mutex_;
  std::unordered_map<std::pair<const void*, size_t>, std::vector<void*>, KeyHash> free_;
  size_t cached_ = 0;
  const size_t capacity_;
  const size_t max_block_;
};

}  // namespace dpt
