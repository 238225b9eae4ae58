#include "data/token_file.h"

#include <gtest/gtest.h>

#include <cstring>
#include <numeric>
#include <set>

#include "data/token_windows.h"
#include "temp_dir.h"

namespace dpt::data {
namespace {

using testing::expect_error_containing;
using testing::TempDir;

std::vector<uint16_t> iota_tokens(size_t n) {
  std::vector<uint16_t> t(n);
  std::iota(t.begin(), t.end(), uint16_t{0});
  return t;
}

TEST(TokenFile, WrittenFileHasTheCommonLayoutAndReadsBack) {
  TempDir dir;
  const std::string path = dir.file("a.bin");
  write_token_file(path, {7, 65535, 0, 42});
  auto bytes = testing::read_bytes(path);
  ASSERT_EQ(bytes.size(), 1024u + 8u);
  int32_t header[4];
  std::memcpy(header, bytes.data(), sizeof(header));
  EXPECT_EQ(header[0], 20240520);
  EXPECT_EQ(header[1], 1);
  EXPECT_EQ(header[2], 4);
  EXPECT_EQ(header[3], 0);
  TokenFile file(path);
  ASSERT_EQ(file.size(), 4);
  EXPECT_EQ(file[0], 7);
  EXPECT_EQ(file[1], 65535);
  EXPECT_EQ(file[3], 42);
  EXPECT_EQ(file.max_token(), 65535);
}

TEST(TokenFile, WrongMagicIsRejectedNamingTheFile) {
  TempDir dir;
  const std::string path = dir.file("bad_magic.bin");
  write_token_file(path, {1, 2, 3});
  auto bytes = testing::read_bytes(path);
  int32_t wrong = 12345;
  std::memcpy(bytes.data(), &wrong, 4);
  testing::write_bytes(path, bytes);
  expect_error_containing([&] { TokenFile f(path); }, {path, "bad magic number 12345", "20240520"});
}

TEST(TokenFile, WrongVersionIsRejected) {
  TempDir dir;
  const std::string path = dir.file("v2.bin");
  write_token_file(path, {1, 2, 3});
  auto bytes = testing::read_bytes(path);
  int32_t version = 2;
  std::memcpy(bytes.data() + 4, &version, 4);
  testing::write_bytes(path, bytes);
  expect_error_containing([&] { TokenFile f(path); }, {path, "unsupported version 2", "expected 1"});
}

TEST(TokenFile, TruncatedTokensAreRejected) {
  TempDir dir;
  const std::string path = dir.file("short.bin");
  write_token_file(path, iota_tokens(100));
  auto bytes = testing::read_bytes(path);
  bytes.resize(bytes.size() - 11);
  testing::write_bytes(path, bytes);
  expect_error_containing([&] { TokenFile f(path); }, {path, "truncated", "100 tokens (200 bytes)", "189 bytes"});
}

TEST(TokenFile, TrailingBytesAreRejected) {
  TempDir dir;
  const std::string path = dir.file("long.bin");
  write_token_file(path, iota_tokens(10));
  auto bytes = testing::read_bytes(path);
  bytes.push_back(0);
  bytes.push_back(0);
  testing::write_bytes(path, bytes);
  expect_error_containing([&] { TokenFile f(path); }, {path, "2 unexpected bytes"});
}

TEST(TokenFile, FileShorterThanTheHeaderIsRejected) {
  TempDir dir;
  const std::string path = dir.file("tiny.bin");
  testing::write_bytes(path, std::vector<char>(100, 0));
  expect_error_containing([&] { TokenFile f(path); }, {path, "100 bytes", "1024-byte header"});
}

TEST(TokenFile, MissingFileIsRejected) {
  TempDir dir;
  const std::string path = dir.file("nope.bin");
  expect_error_containing([&] { TokenFile f(path); }, {path, "cannot open"});
}

TEST(TokenFileDataset, SequentialWindowsTileTheFileWithShiftedTargets) {
  TempDir dir;
  const std::string path = dir.file("seq.bin");
  write_token_file(path, iota_tokens(21));  // (21 - 1) / 4 = 5 windows
  TokenFileDataset ds(path, 4, WindowMode::Sequential, 0);
  ASSERT_EQ(ds.size(), 5);
  Batch b = ds.get_batch({0, 4, 2});
  ASSERT_EQ(b.input.shape(), (Shape{3, 4}));
  ASSERT_EQ(b.input.dtype(), DType::Int32);
  EXPECT_EQ(b.input.to_vector<int32_t>(), (std::vector<int32_t>{0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11}));
  EXPECT_EQ(b.target.to_vector<int32_t>(), (std::vector<int32_t>{1, 2, 3, 4, 17, 18, 19, 20, 9, 10, 11, 12}));
  EXPECT_EQ(ds.max_token(), 20);
}

TEST(TokenFileDataset, RandomWindowsAreSeededAndInRange) {
  TempDir dir;
  const std::string path = dir.file("rand.bin");
  write_token_file(path, iota_tokens(1000));
  TokenFileDataset a(path, 16, WindowMode::Random, 7), b(path, 16, WindowMode::Random, 7),
      c(path, 16, WindowMode::Random, 8);
  EXPECT_EQ(a.size(), 999 / 16);
  bool any_differs = false;
  for (int64_t i = 0; i < a.size(); ++i) {
    const int64_t s = a.window_start(i, 0);
    EXPECT_GE(s, 0);
    EXPECT_LE(s + 16, 999);
    EXPECT_EQ(s, b.window_start(i, 0));
    any_differs |= s != c.window_start(i, 0);
    Batch batch = a.get(i);
    auto in = batch.input.to_vector<int32_t>();
    auto tg = batch.target.to_vector<int32_t>();
    for (int t = 0; t < 16; ++t) {
      EXPECT_EQ(in[t], s + t);  // token at position p is p
      EXPECT_EQ(tg[t], s + t + 1);
    }
  }
  EXPECT_TRUE(any_differs);
}

TEST(TokenFileDataset, EachEpochDrawsFreshRandomWindows) {
  TempDir dir;
  const std::string path = dir.file("epochs.bin");
  write_token_file(path, iota_tokens(100000));
  TokenFileDataset ds(path, 64, WindowMode::Random, 3);
  int64_t same = 0;
  for (int64_t i = 0; i < ds.size(); ++i) {
    same += ds.window_start(i, 0) == ds.window_start(i, 1);
    // A batch is a pure function of (indices, epoch): asked twice, it is the same.
    EXPECT_EQ(ds.get(i, 5).input.to_vector<int32_t>(), ds.get(i, 5).input.to_vector<int32_t>());
    EXPECT_EQ(ds.get(i, 5).input.to_vector<int32_t>()[0], ds.window_start(i, 5) % 65536);  // token p is p mod 2^16
  }
  // 1561 windows over 99936 starts: by chance about 0.02 coincide.
  EXPECT_LE(same, 2) << "epoch 1 repeats epoch 0's windows";
}

TEST(TokenFileDataset, RandomWindowStartsCoverTheStreamUniformly) {
  TempDir dir;
  const std::string path = dir.file("uniform.bin");
  write_token_file(path, iota_tokens(20001));
  TokenFileDataset ds(path, 100, WindowMode::Random, 11);  // starts in [0, 19900], 200 windows an epoch
  constexpr int kBins = 20;
  std::vector<double> counts(kBins, 0.0);
  int64_t draws = 0;
  for (int64_t epoch = 0; epoch < 100; ++epoch) {
    for (int64_t i = 0; i < ds.size(); ++i) {
      const int64_t s = ds.window_start(i, epoch);
      ASSERT_GE(s, 0);
      ASSERT_LE(s, 19900);
      counts[static_cast<size_t>(s * kBins / 19901)] += 1;
      ++draws;
    }
  }
  // Pearson's chi-square over 20 equal bins has 19 degrees of freedom: 43.8 is its 0.999 quantile.
  const double expected = static_cast<double>(draws) / kBins;
  double chi2 = 0;
  for (double c : counts) chi2 += (c - expected) * (c - expected) / expected;
  EXPECT_LT(chi2, 43.8);
  // The old draw, fixed per index, saw only 200 distinct starts in all these epochs.
  std::set<int64_t> distinct;
  for (int64_t epoch = 0; epoch < 100; ++epoch) distinct.insert(ds.window_start(0, epoch));
  EXPECT_GE(distinct.size(), 99u);
}

TEST(TokenFileDataset, RangeSplitsTrainAndValidation) {
  TempDir dir;
  const std::string path = dir.file("split.bin");
  write_token_file(path, iota_tokens(100));
  TokenFileDataset val(path, 4, WindowMode::Sequential, 0, Range{0.9, 1.0});  // tokens 90..99
  EXPECT_EQ(val.num_tokens(), 10);
  EXPECT_EQ(val.size(), 2);
  EXPECT_EQ(val.get(1).input.to_vector<int32_t>(), (std::vector<int32_t>{94, 95, 96, 97}));
}

TEST(TokenFileDataset, TooFewTokensForOneWindowIsAnError) {
  TempDir dir;
  const std::string path = dir.file("few.bin");
  write_token_file(path, iota_tokens(8));
  expect_error_containing([&] { TokenFileDataset ds(path, 8, WindowMode::Sequential, 0); },
                          {path, "8 tokens", "seq_len 8", "at least 9"});
}

TEST(TokenFileDataset, IndexOutOfRangeIsAnError) {
  TempDir dir;
  const std::string path = dir.file("idx.bin");
  write_token_file(path, iota_tokens(9));
  TokenFileDataset ds(path, 4, WindowMode::Sequential, 0);
  expect_error_containing([&] { ds.get(2); }, {"index 2 is outside [0, 2)"});
}

TEST(SyntheticTokens, AreDeterministicAndMostlyFollowOneRule) {
  auto a = synthetic_tokens(2000, 64, 3), b = synthetic_tokens(2000, 64, 3), c = synthetic_tokens(2000, 64, 4);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  // The most common successor of each token covers most transitions (noise 0.1).
  std::vector<std::vector<int>> counts(64, std::vector<int>(64, 0));
  for (size_t i = 1; i < a.size(); ++i) counts[a[i - 1]][a[i]]++;
  int predictable = 0;
  for (auto& row : counts) predictable += *std::max_element(row.begin(), row.end());
  EXPECT_GT(predictable, 1999 * 0.8);
  for (uint16_t t : a) EXPECT_LT(t, 64);
}

TEST(SyntheticTokens, EnsureWritesOnceThenReuses) {
  TempDir dir;
  const std::string path = dir.file("gen/tokens.bin");
  EXPECT_TRUE(ensure_synthetic_token_file(path, 500, 100, 1));
  EXPECT_FALSE(ensure_synthetic_token_file(path, 500, 100, 1));
  TokenFile f(path);
  ASSERT_EQ(f.size(), 500);
  auto expected = synthetic_tokens(500, 100, 1);
  EXPECT_EQ(std::vector<uint16_t>(f.tokens(), f.tokens() + 500), expected);
  // A damaged file is regenerated.
  auto bytes = testing::read_bytes(path);
  bytes.resize(1100);
  testing::write_bytes(path, bytes);
  EXPECT_TRUE(ensure_synthetic_token_file(path, 500, 100, 1));
  EXPECT_EQ(TokenFile(path).size(), 500);
}

}  // namespace
}  // namespace dpt::data
