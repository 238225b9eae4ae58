#include <gtest/gtest.h>

#include "core/cuda_runtime.h"
#include "core/factory.h"
#include "data/loader.h"
#include "data/sampler.h"
#include "data/tensor_dataset.h"

namespace dpt::data {
namespace {

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
  for (int prefetch : {0, 1, 3}) {
    Loader loader(ds, sampler, {.batch_size = 8, .prefetch = prefetch, .device = Device::cuda(0)});
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

}  // namespace
}  // namespace dpt::data
