// The CUDA graph's allocator (core/cuda/graph_memory.h): a free piece serves a smaller request, split when
// it is more than twice the request, and freed pieces of one block merge back, so a large block freed in
// a step serves the transient requests after it without the graph taking new memory from the pool.
#include <gtest/gtest.h>

#include <cstddef>

#include "core/cuda_runtime.h"

#ifdef DPT_HAVE_CUDA
#include "core/cuda/graph_memory.h"

namespace dpt::cuda {
namespace {

constexpr size_t kKiB = 1024;

TEST(CudaGraphMemory, LargeFreePiecesAreSplitAndMergeBackWhenFreed) {
  if (!is_available()) GTEST_SKIP() << "no CUDA device";
  GraphMemory m(0);
  char* block = static_cast<char*>(m.take(1024 * kKiB));
  EXPECT_EQ(m.reserved_bytes(), 1024 * kKiB);
  m.give_back(block);
  EXPECT_EQ(m.outstanding_bytes(), 0u);

  // 256 KiB from the free 1 MiB: split; the next 256 KiB from the 768 KiB rest: split again.
  char* a = static_cast<char*>(m.take(256 * kKiB));
  char* b = static_cast<char*>(m.take(256 * kKiB));
  EXPECT_EQ(a, block);
  EXPECT_EQ(b, block + 256 * kKiB);
  EXPECT_TRUE(m.owns(a) && m.owns(b));
  EXPECT_FALSE(m.owns(block + 512 * kKiB)) << "the free rest is no handed-out piece";
  // 300 KiB: the 512 KiB rest is less than twice that, so it is handed out whole.
  char* c = static_cast<char*>(m.take(300 * kKiB));
  EXPECT_EQ(c, block + 512 * kKiB);
  EXPECT_EQ(m.outstanding_bytes(), 1024 * kKiB);
  EXPECT_EQ(m.reserved_bytes(), 1024 * kKiB) << "no new block while pieces fit";

  // Freed in an order that merges with the next piece, then with the previous one.
  m.give_back(b);
  m.give_back(a);
  m.give_back(c);
  EXPECT_EQ(m.outstanding_bytes(), 0u);
  EXPECT_EQ(m.take(1024 * kKiB), block) << "the pieces merged back into the whole block";
  EXPECT_EQ(m.reserved_bytes(), 1024 * kKiB);
}

TEST(CudaGraphMemory, PiecesOfDifferentBlocksNeverMerge) {
  if (!is_available()) GTEST_SKIP() << "no CUDA device";
  GraphMemory m(0);
  char* first = static_cast<char*>(m.take(512 * kKiB));
  char* second = static_cast<char*>(m.take(512 * kKiB));
  EXPECT_EQ(m.reserved_bytes(), 1024 * kKiB);
  m.give_back(first);
  m.give_back(second);
  // Even if the pool placed the blocks side by side, a request for both needs a new block.
  m.take(1024 * kKiB);
  EXPECT_EQ(m.reserved_bytes(), 2048 * kKiB);
}

}  // namespace
}  // namespace dpt::cuda
#endif
