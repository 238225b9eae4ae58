// The CUDA runtime: device discovery, the stream-ordered pool allocator and its counters, streams and
// events, status checks. Skipped without a GPU (and the CUDA-only parts compiled out without CUDA).
#include "core/cuda_runtime.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "core/error.h"
#include "core/factory.h"
#include "core/ops.h"
#ifdef DPT_HAVE_CUDA
#include "core/cuda/check.h"
#include "core/cuda/handles.h"
#include "core/cuda/memory.h"
#include "core/cuda/stream.h"
#endif

namespace dpt {
namespace {

#define SKIP_WITHOUT_GPU() \
  if (!cuda::is_available()) GTEST_SKIP() << "no CUDA device"

const TensorOptions kGpu = TensorOptions{}.with_device(Device::cuda(0));

TEST(CudaRuntime, AvailabilityMatchesDeviceCount) {
  EXPECT_EQ(cuda::is_available(), cuda::device_count() > 0);
  if (!cuda::is_available()) {
    EXPECT_EQ(cuda::memory_allocated(0), 0u);  // no GPU: answers, never aborts
    return;
  }
  cuda::set_device(0);
  EXPECT_EQ(cuda::current_device(), 0);
  EXPECT_THROW(cuda::set_device(cuda::device_count()), Error);
}

TEST(CudaAllocator, LiveBytesGoBackDownWhenTensorsDie) {
  SKIP_WITHOUT_GPU();
  const size_t before = cuda::memory_allocated(0);
  {
    Tensor a = Tensor::empty({1 << 20}, kGpu);                           // 4 MiB
    Tensor b = Tensor::empty({1000}, kGpu.with_dtype(DType::BFloat16));  // 2000 bytes
    EXPECT_EQ(cuda::memory_allocated(0), before + (size_t{4} << 20) + 2000);
  }
  EXPECT_EQ(cuda::memory_allocated(0), before);
}

TEST(CudaAllocator, PeakCoversTheLargestTensor) {
  SKIP_WITHOUT_GPU();
  cuda::reset_peak_memory_stats(0);
  const size_t before = cuda::memory_allocated(0);
  EXPECT_EQ(cuda::max_memory_allocated(0), before);
  { Tensor big = Tensor::empty({64 << 20}, kGpu); }  // 256 MiB, gone again
  EXPECT_GE(cuda::max_memory_allocated(0), before + (size_t{256} << 20));
  EXPECT_EQ(cuda::memory_allocated(0), before);
  cuda::reset_peak_memory_stats(0);
  EXPECT_EQ(cuda::max_memory_allocated(0), before);
}

#ifdef DPT_HAVE_CUDA
// The host-side cache in front of the pool: a freed block comes back for the next request of its size on
// the stream it was freed on, and never for another stream, which is not ordered after its last use.
TEST(CudaAllocator, AFreedBlockServesItsStreamAgainAndNoOther) {
  SKIP_WITHOUT_GPU();
  if (const char* v = std::getenv("DPT_NO_CUDA_MEMORY_CACHING"); v && std::string(v) == "1") {
    GTEST_SKIP() << "host-side block cache turned off";
  }
  void* first = nullptr;
  {
    Tensor t = Tensor::empty({12345}, kGpu);
    t.fill_(1.0);
    first = t.data_ptr();
  }
  cudaStream_t side = cuda::create_stream(0);
  {
    cuda::StreamGuard on_side(side);
    Tensor other = Tensor::empty({12345}, kGpu);
    EXPECT_NE(other.data_ptr(), first);
    other.fill_(2.0);
    EXPECT_DOUBLE_EQ(sum(other).item(), 2.0 * 12345);
  }
  Tensor again = Tensor::empty({12345}, kGpu);
  EXPECT_EQ(again.data_ptr(), first);
  again.fill_(3.0);
  EXPECT_DOUBLE_EQ(sum(again).item(), 3.0 * 12345);
  cuda::synchronize();
  cuda::destroy_stream(side);
}

TEST(CudaAllocator, FreedBlocksAreReusedNotReallocated) {
  SKIP_WITHOUT_GPU();
  { Tensor warm = Tensor::empty({32 << 20}, kGpu); }  // 128 MiB into the pool, then cached
  cuda::synchronize();
  const size_t reserved = cuda::pool_reserved_bytes(0);
  EXPECT_GE(reserved, size_t{128} << 20);
  for (int i = 0; i < 10; ++i) {
    Tensor t = Tensor::empty({32 << 20}, kGpu);
    t.fill_(static_cast<double>(i));
  }
  cuda::synchronize();
  EXPECT_EQ(cuda::pool_reserved_bytes(0), reserved) << "the pool grew instead of reusing a cached block";
}

TEST(CudaStreams, DefaultStreamIsNonBlockingAndGuardsSwitchIt) {
  SKIP_WITHOUT_GPU();
  cudaStream_t def = cuda::current_stream(0);
  ASSERT_NE(def, nullptr);  // never the legacy stream: graph capture needs a real one
  EXPECT_EQ(def, cuda::default_stream(0));
  unsigned int flags = 0;
  DPT_CUDA_CHECK(cudaStreamGetFlags(def, &flags));
  EXPECT_TRUE(flags & cudaStreamNonBlocking);

  cudaStream_t side = cuda::create_stream(0, -1);
  {
    cuda::StreamGuard guard(side);
    EXPECT_EQ(cuda::current_stream(0), side);
    // Work queued on the side stream, then handed to the default stream through an event.
    Tensor x = full({1 << 20}, 3.0, kGpu);
    cuda::CudaEvent ready;
    ready.record();
    ready.wait(def);
    cuda::StreamGuard back(def);
    EXPECT_EQ(cuda::current_stream(0), def);
    EXPECT_DOUBLE_EQ(sum(x).item(), 3.0 * (1 << 20));
  }
  EXPECT_EQ(cuda::current_stream(0), def);
  DPT_CUDA_CHECK(cudaStreamSynchronize(side));
  cuda::destroy_stream(side);
}

TEST(CudaStreams, EventsTimeAndQuery) {
  SKIP_WITHOUT_GPU();
  cuda::CudaEvent start(true), stop(true);
  start.record();
  Tensor a = randn({512, 512}, default_generator(), kGpu);
  Tensor c = matmul(a, a);
  stop.record();
  stop.synchronize();
  EXPECT_TRUE(stop.query());
  EXPECT_GE(start.elapsed_ms(stop), 0.0f);
}

TEST(CudaChecks, FailuresNameTheCallAndTheLibraryMessage) {
  SKIP_WITHOUT_GPU();
  try {
    DPT_CUDA_CHECK(cudaSetDevice(1 << 20));
    FAIL() << "expected a throw";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("cudaSetDevice(1 << 20)"), std::string::npos) << what;
    EXPECT_NE(what.find("cuda_runtime_test.cpp"), std::string::npos) << what;
    EXPECT_NE(what.find("invalid device"), std::string::npos) << what;
  }
  EXPECT_FALSE(cuda::allow_tf32());  // float32 parity tests rely on plain float32 GEMMs
}
#endif

TEST(CudaCopies, HostDeviceRoundTripsAndDeviceClones) {
  SKIP_WITHOUT_GPU();
  std::vector<float> values(1001);
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i) * 0.5f - 3.0f;
  Tensor host = from_vector(values, {7, 143});
  Tensor dev = host.to(Device::cuda(0));
  EXPECT_TRUE(dev.device().is_cuda());
  Tensor copy = dev.clone();
  Tensor other = Tensor::empty({7, 143}, kGpu);
  other.copy_(host);
  EXPECT_EQ(copy.to_vector<float>(), values);
  EXPECT_EQ(other.to_vector<float>(), values);
  EXPECT_EQ(dev.to(Device::cpu()).to_vector<float>(), values);
}

}  // namespace
}  // namespace dpt
