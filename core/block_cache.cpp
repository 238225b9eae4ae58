#include "core/block_cache.h"

namespace dpt {

void* BlockCache::take(const void* stream, size_t bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = free_.find({stream, bytes});
  if (it == free_.end() || it->second.empty()) return nullptr;
  void* ptr = it->second.back();
  it->second.pop_back();
  cached_ -= bytes;
  return ptr;
}

BlockCache::Put BlockCache::put(const void* stream, size_t bytes, void* ptr) {
  if (bytes > max_block_) return Put::TooLarge;
  std::lock_guard<std::mutex> lock(mutex_);
  if (cached_ + bytes > capacity_) return Put::Full;
  free_[{stream, bytes}].push_back(ptr);
  cached_ += bytes;
  return Put::Kept;
}

std::vector<BlockCache::Block> BlockCache::drain() {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<Block> out;
  for (auto& [key, ptrs] : free_) {
    for (void* p : ptrs) out.push_back({key.first, key.second, p});
  }
  free_.clear();
  cached_ = 0;
  return out;
}

std::vector<BlockCache::Block> BlockCache::drain(const void* stream) {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<Block> out;
  for (auto it = free_.begin(); it != free_.end();) {
    if (it->first.first != stream) {
      ++it;
      continue;
    }
    for (void* p : it->second) out.push_back({stream, it->first.second, p});
    cached_ -= it->first.second * it->second.size();
    it = free_.erase(it);
  }
  return out;
}

size_t BlockCache::cached_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return cached_;
}

}  // namespace dpt
