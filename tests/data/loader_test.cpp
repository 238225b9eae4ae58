#include "data/loader.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "core/error.h"
#include "core/factory.h"
#include "data/sampler.h"
#include "data/tensor_dataset.h"
#include "temp_dir.h"

namespace dpt::data {
namespace {

using testing::expect_error_containing;

// Example i has input [i, 100 + i] and target i, so a batch shows exactly which indices it holds.
std::shared_ptr<TensorDataset> numbered(int64_t n) {
  std::vector<float> x;
  std::vector<int32_t> y;
  for (int64_t i = 0; i < n; ++i) {
    x.push_back(static_cast<float>(i));
    x.push_back(static_cast<float>(100 + i));
    y.push_back(static_cast<int32_t>(i));
  }
  return std::make_shared<TensorDataset>(from_vector(x, {n, 2}),
                                         from_vector(y, {n}, TensorOptions{}.with_dtype(DType::Int32)));
}

std::vector<int32_t> ids(const Batch& b) { return b.target.to_vector<int32_t>(); }

TEST(Samplers, RandomSamplerIsASeededPermutationPerEpoch) {
  RandomSampler s(50, 3), same(50, 3), other(50, 4);
  auto e0 = s.epoch_indices(0), e1 = s.epoch_indices(1);
  auto sorted = e0;
  std::sort(sorted.begin(), sorted.end());
  for (int64_t i = 0; i < 50; ++i) EXPECT_EQ(sorted[i], i);
  EXPECT_EQ(e0, same.epoch_indices(0));
  EXPECT_NE(e0, e1);
  EXPECT_NE(e0, other.epoch_indices(0));
  s.set_epoch(1);
  EXPECT_EQ(s.indices(), e1);
  EXPECT_EQ(SequentialSampler(3).epoch_indices(9), (std::vector<int64_t>{0, 1, 2}));
}

TEST(Loader, BatchesFollowTheSamplerAcrossEpochs) {
  auto ds = numbered(10);
  auto sampler = std::make_shared<RandomSampler>(10, 1);
  Loader loader(ds, sampler, {.batch_size = 3, .drop_last = true, .prefetch = 2});
  EXPECT_EQ(loader.batches_per_epoch(), 3);  // 10 / 3, tail dropped
  for (int64_t epoch = 0; epoch < 3; ++epoch) {
    auto order = sampler->epoch_indices(epoch);
    for (int64_t b = 0; b < 3; ++b) {
      EXPECT_EQ(loader.position(), (LoaderPosition{epoch, b}));
      Batch batch = loader.next();
      EXPECT_EQ(batch.input.shape(), (Shape{3, 2}));
      std::vector<int32_t> expected(order.begin() + 3 * b, order.begin() + 3 * b + 3);
      EXPECT_EQ(ids(batch), expected);
      auto x = batch.input.to_vector<float>();
      for (int i = 0; i < 3; ++i) EXPECT_EQ(x[2 * i + 1], 100 + expected[i]);
    }
  }
  EXPECT_EQ(loader.position(), (LoaderPosition{3, 0}));
}

TEST(Loader, KeepsAFinalPartialBatchWithoutDropLast) {
  Loader loader(numbered(5), std::make_shared<SequentialSampler>(5), {.batch_size = 2, .drop_last = false});
  EXPECT_EQ(loader.batches_per_epoch(), 3);
  EXPECT_EQ(ids(loader.next()), (std::vector<int32_t>{0, 1}));
  EXPECT_EQ(ids(loader.next()), (std::vector<int32_t>{2, 3}));
  EXPECT_EQ(ids(loader.next()), (std::vector<int32_t>{4}));
  EXPECT_EQ(ids(loader.next()), (std::vector<int32_t>{0, 1}));
}

TEST(Loader, IsDeterministicWhateverThePrefetchDepth) {
  auto ds = numbered(37);
  std::vector<std::vector<int32_t>> runs[3];
  const int depths[3] = {0, 1, 4};
  for (int r = 0; r < 3; ++r) {
    Loader loader(ds, std::make_shared<RandomSampler>(37, 11), {.batch_size = 4, .prefetch = depths[r]});
    for (int step = 0; step < 25; ++step) runs[r].push_back(ids(loader.next()));
  }
  EXPECT_EQ(runs[0], runs[1]);
  EXPECT_EQ(runs[0], runs[2]);
}

TEST(Loader, ResumesExactlyFromASavedPosition) {
  auto ds = numbered(23);
  auto sampler = std::make_shared<RandomSampler>(23, 2);
  Loader first(ds, sampler, {.batch_size = 4});
  std::vector<std::vector<int32_t>> uninterrupted;
  LoaderPosition saved;
  for (int step = 0; step < 17; ++step) {
    if (step == 7) saved = first.position();
    uninterrupted.push_back(ids(first.next()));
  }
  EXPECT_EQ(saved, (LoaderPosition{1, 2}));  // 5 batches per epoch
  Loader resumed(ds, sampler, {.batch_size = 4});
  resumed.set_position(saved);
  for (int step = 7; step < 17; ++step) EXPECT_EQ(ids(resumed.next()), uninterrupted[step]) << "step " << step;
  // Moving the same loader back also works (prefetched batches are discarded).
  first.set_epoch(0);
  EXPECT_EQ(ids(first.next()), uninterrupted[0]);
  expect_error_containing([&] { first.set_position({0, 5}); }, {"epoch has 5 batches"});
}

TEST(Loader, BatchLargerThanTheDataIsAnError) {
  expect_error_containing([&] { Loader l(numbered(5), std::make_shared<SequentialSampler>(5), {.batch_size = 8}); },
                          {"batch size 8", "5 examples"});
  expect_error_containing([&] { Loader l(numbered(5), std::make_shared<SequentialSampler>(5), {.batch_size = 0}); },
                          {"batch_size must be > 0"});
}

// Fails for one index, like a dataset whose file went bad under it.
class FailingDataset : public TensorDataset {
 public:
  FailingDataset()
      : TensorDataset(from_vector(std::vector<float>(8, 1.0f), {8}), from_vector(std::vector<float>(8, 0.0f), {8})) {}

 protected:
  Batch gather(const std::vector<int64_t>& indices, int64_t epoch) const override {
    for (int64_t i : indices) DPT_CHECK(i != 6, "cannot read example {}", i);
    return TensorDataset::gather(indices, epoch);
  }
};

TEST(Loader, ErrorsFromTheBackgroundThreadReachTheCaller) {
  Loader loader(std::make_shared<FailingDataset>(), std::make_shared<SequentialSampler>(8), {.batch_size = 2});
  loader.next();
  loader.next();
  loader.next();
  expect_error_containing([&] { loader.next(); }, {"cannot read example 6"});
}

TEST(Loader, CudaDeviceWithoutAGpuBuildIsAClearError) {
#ifndef DPT_HAVE_CUDA
  expect_error_containing(
      [&] {
        Loader l(numbered(4), std::make_shared<SequentialSampler>(4), {.batch_size = 2, .device = Device::cuda(0)});
      },
      {"built without CUDA"});
#else
  GTEST_SKIP() << "CUDA build: covered by LoaderOnGpu";
#endif
}

}  // namespace
}  // namespace dpt::data
