#include "data/idx_file.h"

#include <gtest/gtest.h>

#include "temp_dir.h"

namespace dpt::data {
namespace {

using testing::expect_error_containing;
using testing::TempDir;

void write_mnist_pair(const TempDir& dir) {
  // Three 2x2 images; image i has pixel values {0, 255, i, 51}.
  write_idx_file(dir.file("images.idx"), {{3, 2, 2}, {0, 255, 0, 51, 0, 255, 1, 51, 0, 255, 2, 51}});
  write_idx_file(dir.file("labels.idx"), {{3}, {7, 0, 9}});
}

TEST(IdxFile, RoundTripsWithBigEndianDimensions) {
  TempDir dir;
  write_mnist_pair(dir);
  auto bytes = testing::read_bytes(dir.file("images.idx"));
  ASSERT_EQ(bytes.size(), 4u + 12u + 12u);
  EXPECT_EQ(bytes[2], 0x08);
  EXPECT_EQ(bytes[3], 3);
  EXPECT_EQ(bytes[7], 3);  // big-endian 3
  IdxArray a = read_idx_file(dir.file("images.idx"));
  EXPECT_EQ(a.dims, (std::vector<int64_t>{3, 2, 2}));
  EXPECT_EQ(a.data[1], 255);
}

TEST(MnistDataset, ScalesPixelsAndKeepsLabels) {
  TempDir dir;
  write_mnist_pair(dir);
  auto ds = make_mnist_dataset(dir.file("images.idx"), dir.file("labels.idx"));
  ASSERT_EQ(ds->size(), 3);
  Batch b = ds->get_batch({2, 0});
  EXPECT_EQ(b.input.shape(), (Shape{2, 1, 2, 2}));
  auto x = b.input.to_vector<float>();
  EXPECT_FLOAT_EQ(x[1], 1.0f);
  EXPECT_FLOAT_EQ(x[2], 2.0f / 255.0f);
  EXPECT_FLOAT_EQ(x[3], 0.2f);
  EXPECT_EQ(b.target.to_vector<int32_t>(), (std::vector<int32_t>{9, 7}));
  auto flat = make_mnist_dataset(dir.file("images.idx"), dir.file("labels.idx"), /*flatten=*/true);
  EXPECT_EQ(flat->get(0).input.shape(), (Shape{1, 4}));
}

TEST(IdxFile, DamagedFilesAreRejectedNamingTheFile) {
  TempDir dir;
  write_mnist_pair(dir);
  const std::string path = dir.file("images.idx");
  auto good = testing::read_bytes(path);

  auto bad = good;
  bad[0] = 1;
  testing::write_bytes(path, bad);
  expect_error_containing([&] { read_idx_file(path); }, {path, "bad magic"});

  bad = good;
  bad[2] = 0x0D;  // float elements
  testing::write_bytes(path, bad);
  expect_error_containing([&] { read_idx_file(path); }, {path, "0x0d", "unsigned byte"});

  bad = good;
  bad[3] = 0;
  testing::write_bytes(path, bad);
  expect_error_containing([&] { read_idx_file(path); }, {path, "rank 0"});

  bad = good;
  bad.resize(bad.size() - 1);
  testing::write_bytes(path, bad);
  expect_error_containing([&] { read_idx_file(path); }, {path, "truncated"});

  bad = good;
  bad.resize(10);  // inside the dimension list
  testing::write_bytes(path, bad);
  expect_error_containing([&] { read_idx_file(path); }, {path, "truncated header"});

  bad = good;
  bad.push_back(1);
  testing::write_bytes(path, bad);
  expect_error_containing([&] { read_idx_file(path); }, {path, "trailing bytes"});

  expect_error_containing([&] { read_idx_file(dir.file("missing.idx")); }, {"missing.idx", "does not exist"});
}

TEST(MnistDataset, MismatchedCountsAndBadLabelsAreErrors) {
  TempDir dir;
  write_mnist_pair(dir);
  write_idx_file(dir.file("two_labels.idx"), {{2}, {1, 2}});
  expect_error_containing([&] { make_mnist_dataset(dir.file("images.idx"), dir.file("two_labels.idx")); },
                          {"3 images", "2 labels"});
  write_idx_file(dir.file("big_label.idx"), {{3}, {1, 2, 12}});
  expect_error_containing([&] { make_mnist_dataset(dir.file("images.idx"), dir.file("big_label.idx")); },
                          {"label 12 at index 2", "num_classes 10"});
  expect_error_containing([&] { make_mnist_dataset(dir.file("labels.idx"), dir.file("labels.idx")); },
                          {"expected 3 dimensions"});
}

}  // namespace
}  // namespace dpt::data
