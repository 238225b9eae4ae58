#include "data/char_text.h"

#include <gtest/gtest.h>

#include "temp_dir.h"

namespace dpt::data {
namespace {

using testing::expect_error_containing;
using testing::TempDir;

TEST(CharVocab, IsTheSortedSetOfDistinctBytes) {
  CharVocab v("hello world");
  EXPECT_EQ(v.chars(), " dehlorw");
  EXPECT_EQ(v.size(), 8);
  EXPECT_EQ(v.encode("hold"), (std::vector<int32_t>{3, 5, 4, 1}));
  EXPECT_EQ(v.decode({3, 2, 4, 4, 5}), "hello");
  expect_error_containing([&] { v.encode("z"); }, {"'z'", "not in the vocabulary of 8"});
  expect_error_containing([&] { v.decode({8}); }, {"token id 8", "[0, 8)"});
}

TEST(CharTextDataset, WindowsAreCharacterIdsWithShiftedTargets) {
  TempDir dir;
  const std::string path = dir.file("t.txt");
  testing::write_text(path, "abcabcabcab");  // 11 characters, vocab {a,b,c}
  CharTextDataset ds(path, 3, WindowMode::Sequential, 0);
  EXPECT_EQ(ds.vocab().chars(), "abc");
  ASSERT_EQ(ds.size(), 3);  // (11 - 1) / 3
  Batch b = ds.get_batch({1, 0});
  EXPECT_EQ(b.input.shape(), (Shape{2, 3}));
  EXPECT_EQ(b.input.to_vector<int32_t>(), (std::vector<int32_t>{0, 1, 2, 0, 1, 2}));   // "abc", "abc"
  EXPECT_EQ(b.target.to_vector<int32_t>(), (std::vector<int32_t>{1, 2, 0, 1, 2, 0}));  // "bca", "bca"
  EXPECT_NE(ds.describe().find(path), std::string::npos);
}

TEST(CharTextDataset, ValidationRangeSharesTheWholeFilesVocabulary) {
  TempDir dir;
  const std::string path = dir.file("v.txt");
  testing::write_text(path, "aaaaaaaaaaaaaaaaaazz");  // 'z' only in the last 10%
  CharTextDataset train(path, 2, WindowMode::Sequential, 0, Range{0.0, 0.9});
  CharTextDataset val(path, 1, WindowMode::Sequential, 0, Range{0.9, 1.0});
  EXPECT_EQ(train.vocab().chars(), "az");
  EXPECT_EQ(val.get(0).input.to_vector<int32_t>(), (std::vector<int32_t>{1}));
}

TEST(CharTextDataset, MissingEmptyOrShortFilesAreErrors) {
  TempDir dir;
  expect_error_containing([&] { CharTextDataset d(dir.file("missing.txt"), 4, WindowMode::Random, 0); },
                          {dir.file("missing.txt"), "does not exist"});
  testing::write_text(dir.file("empty.txt"), "");
  expect_error_containing([&] { CharTextDataset d(dir.file("empty.txt"), 4, WindowMode::Random, 0); },
                          {dir.file("empty.txt"), "is empty"});
  testing::write_text(dir.file("short.txt"), "abc");
  expect_error_containing([&] { CharTextDataset d(dir.file("short.txt"), 4, WindowMode::Random, 0); },
                          {dir.file("short.txt"), "at least 5"});
}

TEST(CharTextDataset, ShippedCorpusLoads) {
  const std::string path = std::string(DPT_SOURCE_DIR) + "/data/corpus/tiny.txt";
  CharTextDataset ds(path, 64, WindowMode::Random, 1, Range{0.0, 0.9});
  EXPECT_GT(ds.num_tokens(), 4000);
  EXPECT_GE(ds.vocab().size(), 30);
  EXPECT_LE(ds.vocab().size(), 96);
}

}  // namespace
}  // namespace dpt::data
