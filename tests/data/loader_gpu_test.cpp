#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "core/cuda_runtime.h"
#include "core/factory.h"
#include "data/loader.h"
#include "data/sampler.h"
#include "data/tensor_dataset.h"

#ifdef DPT_HAVE_CUDA
#include <cuda_runtime.h>

#include "core/cuda/stream.h"
#endif

namespace dpt::data {
namespace {

// n examples of `features` copies of `fill`, example i labelled first_label + i (int64): the label says
// which row a batch holds.
std::shared_ptr<TensorDataset> labelled(int64_t n, int64_t features, float fill, int64_t first_label) {
  std::vector<int64_t> y(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) y[static_cast<size_t>(i)] = first_label + i;
  const std::vector<float> x(static_cast<size_t>(n * features), fill);
  return std::make_shared<TensorDataset>(from_vector(x, {n, features}),
                                         from_vector(y, {n}, TensorOptions{}.with_dtype(DType::Int64)));
}

// Both device paths: the dataset kept on the device (the default for a small TensorDataset) and the
// batches staged through page-locked memory by the background thread (resident_bytes 0).
TEST(LoaderOnGpu, DeliversTheSameBatchesAsTheHostPathOnTheDevice) {
  if (!dpt::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const int64_t n = 50, f = 33;
  std::vector<float> x(static_cast<size_t>(n * f));
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i) * 0.5f;
  std::vector<int32_t> y(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) y[static_cast<size_t>(i)] = static_cast<int32_t>(i);
  auto ds = std::make_shared<TensorDataset>(from_vector(x, {n, f}),
                                            from_vector(y, {n}, TensorOptions{}.with_dtype(DType::Int32)));
  auto sampler = std::make_shared<RandomSampler>(n, 9);
  for (int64_t resident_bytes : {int64_t{1} << 30, int64_t{0}})
    for (int prefetch : {0, 1, 3}) {
      SCOPED_TRACE(resident_bytes > 0 ? "resident" : "staged");
      Loader loader(
          ds, sampler,
          {.batch_size = 8, .prefetch = prefetch, .device = Device::cuda(0), .resident_bytes = resident_bytes});
      for (int step = 0; step < 20; ++step) {
        const LoaderPosition pos = loader.position();
        Batch expected = loader.host_batch(pos);
        Batch got = loader.next();
        ASSERT_TRUE(got.input.device().is_cuda());
        ASSERT_EQ(got.input.shape(), (Shape{8, f}));
        EXPECT_EQ(got.input.to_vector<float>(), expected.input.to_vector<float>()) << "step " << step;
        EXPECT_EQ(got.target.to_vector<int32_t>(), expected.target.to_vector<int32_t>()) << "step " << step;
      }
      // Resume on the device path too.
      loader.set_position({1, 2});
      EXPECT_EQ(loader.next().target.to_vector<int32_t>(), loader.host_batch({1, 2}).target.to_vector<int32_t>());
    }
}

// Kept on the device, an epoch's final partial batch (drop_last off) and the epochs after it still hold
// the host path's rows.
TEST(LoaderOnGpu, AResidentDatasetKeepsTheFinalPartialBatchAndMovesToTheNextEpoch) {
  if (!dpt::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const int64_t n = 21;
  auto ds = labelled(n, 5, 1.5f, 1000);
  Loader loader(ds, std::make_shared<RandomSampler>(n, 4),
                {.batch_size = 4, .drop_last = false, .device = Device::cuda(0)});
  ASSERT_EQ(loader.batches_per_epoch(), 6);
  for (int step = 0; step < 14; ++step) {
    const LoaderPosition pos = loader.position();
    const Batch got = loader.next();
    EXPECT_EQ(got.target.shape(), (Shape{pos.batch == 5 ? 1 : 4})) << "step " << step;
    EXPECT_EQ(got.target.to_vector<int64_t>(), loader.host_batch(pos).target.to_vector<int64_t>()) << "step " << step;
  }
}

#ifdef DPT_HAVE_CUDA
// A stream held by a host function until the test opens it, or for at most ten seconds. Whatever the host
// synchronises with on that stream while it is held, it waits out the ten seconds for, and `waited_out`
// says so.
struct StreamGate {
  std::atomic<bool> open{false};
  std::atomic<bool> waited_out{false};

  static void hold(void* self) {
    auto* gate = static_cast<StreamGate*>(self);
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (!gate->open.load() && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    gate->waited_out = !gate->open.load();
  }
};

// A new epoch's visiting order goes up to a resident dataset without the host waiting for the steps
// queued before it: next() returns while the consumer's stream is still held, and the batch is right.
TEST(LoaderOnGpu, AResidentDatasetStartsAnEpochWithoutWaitingForTheDevice) {
  if (!dpt::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const int64_t n = 16;
  auto ds = labelled(n, 3, 0.5f, 100);
  Loader loader(ds, std::make_shared<RandomSampler>(n, 5), {.batch_size = 8, .device = Device::cuda(0)});
  ASSERT_EQ(loader.batches_per_epoch(), 2);
  loader.next();
  loader.next();  // epoch 0 served; the next batch starts epoch 1
  dpt::cuda::synchronize();

  StreamGate gate;
  ASSERT_EQ(cudaLaunchHostFunc(dpt::cuda::current_stream(0), &StreamGate::hold, &gate), cudaSuccess);
  const Batch first_of_epoch_1 = loader.next();
  gate.open = true;
  dpt::cuda::synchronize();
  EXPECT_FALSE(gate.waited_out) << "next() waited for the device at the epoch boundary";
  EXPECT_EQ(first_of_epoch_1.target.to_vector<int64_t>(), loader.host_batch({1, 0}).target.to_vector<int64_t>());
}

// The next batch is gathered ahead, beside the step that uses the current one: with the consumer's stream
// held, the batch next() hands out is already complete, read here on another stream.
TEST(LoaderOnGpu, AResidentDatasetGathersTheNextBatchBesideTheConsumersStream) {
  if (!dpt::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const int64_t n = 16;
  auto ds = labelled(n, 3, 0.5f, 100);
  Loader loader(ds, std::make_shared<RandomSampler>(n, 7), {.batch_size = 4, .device = Device::cuda(0)});
  loader.next();
  dpt::cuda::synchronize();

  StreamGate gate;
  ASSERT_EQ(cudaLaunchHostFunc(dpt::cuda::current_stream(0), &StreamGate::hold, &gate), cudaSuccess);
  const Batch second = loader.next();
  cudaStream_t reader = dpt::cuda::create_stream(0);
  std::vector<int64_t> got;
  {
    dpt::cuda::StreamGuard on_reader(reader);
    got = second.target.to_vector<int64_t>();
  }
  gate.open = true;
  dpt::cuda::synchronize();
  dpt::cuda::destroy_stream(reader);
  EXPECT_FALSE(gate.waited_out) << "next() or reading the batch waited for the consumer's stream";
  EXPECT_EQ(got, loader.host_batch({0, 1}).target.to_vector<int64_t>());
  EXPECT_EQ(loader.next().target.to_vector<int64_t>(), loader.host_batch({0, 2}).target.to_vector<int64_t>());
}
#endif

}  // namespace
}  // namespace dpt::data
