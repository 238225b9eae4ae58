// Sharded token data (data/token_shards.h, TokenFileDataset over a glob): shards are read in sorted
// order as one stream, windows never cross a shard boundary (as llm.c's DataLoader), every shard is
// validated with its name in the error, and a pattern that matches nothing is an error naming it.
#include "data/token_shards.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <vector>

#include "data/token_file.h"
#include "data/token_windows.h"
#include "temp_dir.h"

namespace dpt::data {
namespace {

using testing::expect_error_containing;
using testing::TempDir;

// Shard k holds the tokens 1000·k + 0, 1, ..., n_k - 1: a token names its shard and position.
std::vector<uint16_t> shard_tokens(int k, int n) {
  std::vector<uint16_t> t(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) t[static_cast<size_t>(i)] = static_cast<uint16_t>(1000 * k + i);
  return t;
}

// Three shards written out of order, plus a file the pattern must not match.
void write_shards(const TempDir& dir, const std::vector<int>& sizes) {
  for (int k = static_cast<int>(sizes.size()) - 1; k >= 0; --k)
    write_token_file(dir.file("train_00000" + std::to_string(k) + ".bin"),
                     shard_tokens(k, sizes[static_cast<size_t>(k)]));
  write_token_file(dir.file("val_000000.bin"), shard_tokens(9, 50));
}

TEST(TokenShards, AGlobNamesTheMatchingFilesInSortedOrder) {
  TempDir dir;
  write_shards(dir, {10, 10, 10});
  EXPECT_EQ(glob_paths(dir.file("train_*.bin")),
            (std::vector<std::string>{dir.file("train_000000.bin"), dir.file("train_000001.bin"),
                                      dir.file("train_000002.bin")}));
  EXPECT_EQ(glob_paths(dir.file("val_000000.bin")), (std::vector<std::string>{dir.file("val_000000.bin")}));
}

TEST(TokenShards, APatternMatchingNothingIsAnErrorNamingIt) {
  TempDir dir;
  const std::string pattern = dir.file("fineweb_train_*.bin");
  EXPECT_TRUE(glob_paths(pattern).empty());
  expect_error_containing([&] { token_shard_paths(pattern); }, {"no token file matches", pattern});
  expect_error_containing([&] { TokenFileDataset ds(pattern, 4, WindowMode::Sequential, 0); }, {pattern});
}

// Sequential windows over shards of 21, 13 and 9 tokens with seq_len 4: 5 + 3 + 2 windows, each within
// one shard, together exactly the concatenated content of each shard up to its dropped tail.
TEST(TokenShards, SequentialWindowsReadEveryShardInOrderAndNeverCrossOne) {
  TempDir dir;
  const std::vector<int> sizes = {21, 13, 9};
  write_shards(dir, sizes);
  TokenFileDataset ds(dir.file("train_*.bin"), 4, WindowMode::Sequential, 0);
  EXPECT_EQ(ds.num_shards(), 3);
  ASSERT_EQ(ds.size(), 5 + 3 + 2);
  EXPECT_EQ(ds.max_token(), 2008);
  std::vector<int32_t> read, expected;
  for (int64_t i = 0; i < ds.size(); ++i) {
    Batch b = ds.get(i);
    const auto in = b.input.to_vector<int32_t>();
    const auto tg = b.target.to_vector<int32_t>();
    ASSERT_EQ(in.size(), 4u);
    for (size_t t = 0; t < 4; ++t) {
      EXPECT_EQ(tg[t], in[t] + 1) << "window " << i << " crosses a shard boundary";
      EXPECT_EQ(in[t] / 1000, in[0] / 1000) << "window " << i << " mixes shards";
    }
    read.insert(read.end(), in.begin(), in.end());
  }
  for (int k = 0; k < 3; ++k) {
    const int used = (sizes[static_cast<size_t>(k)] - 1) / 4 * 4;
    for (int i = 0; i < used; ++i) expected.push_back(1000 * k + i);
  }
  EXPECT_EQ(read, expected);
}

// Random windows: every shard is drawn from, each window lies within one shard, and the draws are a
// function of (seed, epoch, index).
TEST(TokenShards, RandomWindowsStayInsideOneShardAndCoverThemAll) {
  TempDir dir;
  write_shards(dir, {200, 120, 80});
  TokenFileDataset a(dir.file("train_*.bin"), 8, WindowMode::Random, 3),
      b(dir.file("train_*.bin"), 8, WindowMode::Random, 3);
  ASSERT_EQ(a.size(), 199 / 8 + 119 / 8 + 79 / 8);
  std::set<int> shards_seen;
  for (int64_t epoch = 0; epoch < 3; ++epoch) {
    for (int64_t i = 0; i < a.size(); ++i) {
      ASSERT_EQ(a.window_start(i, epoch), b.window_start(i, epoch));
      const auto in = a.get(i, epoch).input.to_vector<int32_t>();
      const auto tg = a.get(i, epoch).target.to_vector<int32_t>();
      for (size_t t = 0; t < in.size(); ++t) ASSERT_EQ(tg[t], in[t] + 1) << "window " << i << " crosses shards";
      shards_seen.insert(in[0] / 1000);
    }
  }
  EXPECT_EQ(shards_seen, (std::set<int>{0, 1, 2}));
}

TEST(TokenShards, ADamagedShardIsAnErrorNamingThatShard) {
  TempDir dir;
  write_shards(dir, {30, 30, 30});
  testing::write_bytes(dir.file("train_000001.bin"), std::vector<char>(100, 0));
  expect_error_containing([&] { TokenFileDataset ds(dir.file("train_*.bin"), 4, WindowMode::Sequential, 0); },
                          {dir.file("train_000001.bin"), "shorter than the 1024-byte header"});
}

// A range cuts the concatenation: [0.75, 1) of shards of 40 + 40 tokens is the last 20 tokens of the
// second shard.
TEST(TokenShards, ARangeAppliesToTheConcatenatedShards) {
  TempDir dir;
  write_shards(dir, {40, 40});
  TokenFileDataset val(dir.file("train_*.bin"), 4, WindowMode::Sequential, 0, Range{0.75, 1.0});
  EXPECT_EQ(val.num_tokens(), 20);
  ASSERT_EQ(val.size(), 4);
  EXPECT_EQ(val.get(0).input.to_vector<int32_t>(), (std::vector<int32_t>{1020, 1021, 1022, 1023}));
}

}  // namespace
}  // namespace dpt::data
