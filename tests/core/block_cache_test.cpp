// The host-side block cache's policy (core/block_cache.h): blocks come back only for the stream and the
// exact size they were freed with, within the capacity and block-size bounds. Pure host code: the
// "streams" and "blocks" here are addresses of local variables.
#include "core/block_cache.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <set>

namespace dpt {
namespace {

int stream_a, stream_b;
char blocks[8];

TEST(BlockCache, RoundsRequestsUpToWholeGranules) {
  EXPECT_EQ(BlockCache::round_up(1), 512u);
  EXPECT_EQ(BlockCache::round_up(512), 512u);
  EXPECT_EQ(BlockCache::round_up(513), 1024u);
  EXPECT_EQ(BlockCache::round_up(0), 0u);
}

TEST(BlockCache, ABlockComesBackOnlyForItsStreamAndSize) {
  BlockCache cache(1 << 20, 1 << 16);
  ASSERT_EQ(BlockCache::Put::Kept, cache.put(&stream_a, 1024, &blocks[0]));
  EXPECT_EQ(cache.take(&stream_b, 1024), nullptr) << "another stream is not ordered after the free";
  EXPECT_EQ(cache.take(&stream_a, 512), nullptr) << "no splitting";
  EXPECT_EQ(cache.take(&stream_a, 1536), nullptr);
  EXPECT_EQ(cache.cached_bytes(), 1024u);
  EXPECT_EQ(cache.take(&stream_a, 1024), &blocks[0]);
  EXPECT_EQ(cache.take(&stream_a, 1024), nullptr) << "each block is handed out once";
  EXPECT_EQ(cache.cached_bytes(), 0u);
}

TEST(BlockCache, RefusesBlocksOverTheSizeBoundOrPastTheCapacity) {
  BlockCache cache(2048, 1024);
  EXPECT_EQ(cache.put(&stream_a, 1536, &blocks[0]), BlockCache::Put::TooLarge) << "larger than one block may be";
  EXPECT_EQ(cache.put(&stream_a, 1024, &blocks[1]), BlockCache::Put::Kept);
  EXPECT_EQ(cache.put(&stream_b, 1024, &blocks[2]), BlockCache::Put::Kept);
  EXPECT_EQ(cache.put(&stream_a, 512, &blocks[3]), BlockCache::Put::Full) << "capacity is 2048 bytes in all";
  EXPECT_EQ(cache.cached_bytes(), 2048u);
  // The allocator then returns every cached block to the pool: afterwards the cache takes blocks again.
  EXPECT_EQ(cache.drain().size(), 2u);
  EXPECT_EQ(cache.put(&stream_a, 512, &blocks[3]), BlockCache::Put::Kept);
  EXPECT_EQ(cache.cached_bytes(), 512u);
}

TEST(BlockCache, DrainingOneStreamLeavesTheOthers) {
  BlockCache cache(1 << 20, 1 << 16);
  ASSERT_EQ(BlockCache::Put::Kept, cache.put(&stream_a, 512, &blocks[0]));
  ASSERT_EQ(BlockCache::Put::Kept, cache.put(&stream_a, 1024, &blocks[1]));
  ASSERT_EQ(BlockCache::Put::Kept, cache.put(&stream_b, 512, &blocks[2]));
  auto drained = cache.drain(&stream_a);
  ASSERT_EQ(drained.size(), 2u);
  std::set<void*> ptrs;
  for (const auto& b : drained) {
    EXPECT_EQ(b.stream, &stream_a);
    EXPECT_EQ(b.bytes, b.ptr == &blocks[0] ? 512u : 1024u);
    ptrs.insert(b.ptr);
  }
  EXPECT_EQ(ptrs, (std::set<void*>{&blocks[0], &blocks[1]}));
  EXPECT_EQ(cache.cached_bytes(), 512u);
  EXPECT_EQ(cache.take(&stream_a, 512), nullptr);
  auto rest = cache.drain();
  ASSERT_EQ(rest.size(), 1u);
  EXPECT_EQ(rest[0].ptr, &blocks[2]);
  EXPECT_EQ(cache.cached_bytes(), 0u);
}

}  // namespace
}  // namespace dpt
