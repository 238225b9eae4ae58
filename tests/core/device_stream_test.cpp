// core/device_stream.h: side streams and events that code serving CPU and CUDA tensors uses alike.
#include "core/device_stream.h"

#include <gtest/gtest.h>

#include "core/cuda_runtime.h"
#include "core/factory.h"

namespace {

using dpt::Device;
using dpt::SideStream;
using dpt::SideStreamGuard;
using dpt::StreamEvent;

// The host's order is every order on the CPU: no stream, and records, waits and guards change nothing.
TEST(DeviceStream, OnTheCpuThereIsNoSideStreamAndEventsDoNothing) {
  SideStream stream(Device::cpu());
  EXPECT_EQ(stream.handle(), nullptr);
  EXPECT_TRUE(stream.device() == Device::cpu());
  StreamEvent start(Device::cpu(), true), end(Device::cpu(), true);
  dpt::Tensor t = dpt::zeros({4});
  {
    SideStreamGuard guard(stream);
    start.record();
    t.fill_(3.0);
    end.record(stream);
  }
  end.wait();
  end.wait(stream);
  end.synchronize();
  EXPECT_EQ(start.elapsed_ms(end), 0.0f);
  EXPECT_EQ(t.to_vector<float>(), (std::vector<float>{3, 3, 3, 3}));
}

// On a GPU, work queued on the side stream is seen by the current stream once it waits on an event
// recorded after that work, and a timed pair of events measures a non-negative span.
TEST(DeviceStream, OnAGpuAnEventOrdersTheCurrentStreamAfterTheSideStream) {
  if (dpt::cuda::device_count() < 1) GTEST_SKIP() << "needs a GPU";
  const Device gpu = Device::cuda(0);
  SideStream stream(gpu);
  EXPECT_NE(stream.handle(), nullptr);
  dpt::Tensor t = dpt::zeros({1 << 20}, dpt::TensorOptions{}.with_device(gpu));
  StreamEvent start(gpu, true), done(gpu, true);
  start.record();
  start.wait(stream);  // the side stream starts after the zeros
  {
    SideStreamGuard guard(stream);
    t.fill_(2.0);
    done.record(stream);
  }
  done.wait();
  std::vector<float> values = t.to_vector<float>();
  EXPECT_EQ(values.front(), 2.0f);
  EXPECT_EQ(values.back(), 2.0f);
  done.synchronize();
  EXPECT_GE(start.elapsed_ms(done), 0.0f);
}

// wait_external(): a record made each step by eager code on a side stream, waited on by the current stream,
// eagerly and from a replayed CUDA graph. The side stream is held by the host until after the wait (and the
// replay) is queued, so a wait that did not happen would copy the previous step's value.
TEST(DeviceStream, OnAGpuAReplayWaitsForTheRecordMadeBeforeItRuns) {
  if (dpt::cuda::device_count() < 1) GTEST_SKIP() << "needs a GPU";
  const Device gpu = Device::cuda(0);
  const dpt::TensorOptions on_gpu = dpt::TensorOptions{}.with_device(gpu);
  SideStream side(gpu);
  StreamEvent ready(gpu);
  dpt::Tensor a = dpt::zeros({1 << 16}, on_gpu), b = dpt::zeros({1 << 16}, on_gpu);
  auto copy_when_ready = [&] {
    ready.wait_external();
    b.copy_(a);
  };
  dpt::cuda::CudaGraph graph;
  graph.capture(copy_when_ready);  // nothing runs yet
  for (int step = 1; step <= 4; ++step) {
    const bool replay = step % 2 == 0;
    dpt::cuda::HeldStreamTimer hold;
    {
      SideStreamGuard on_side(side);
      hold.hold();  // the side stream waits for the host
      a.fill_(static_cast<double>(step));
      ready.record(side);
    }
    if (replay) {
      graph.replay();
    } else {
      copy_when_ready();
    }
    (void)hold.release_ms();
    std::vector<float> got = b.to_vector<float>();
    EXPECT_EQ(got.front(), static_cast<float>(step)) << (replay ? "replayed" : "eager") << " step " << step;
    EXPECT_EQ(got.back(), static_cast<float>(step)) << (replay ? "replayed" : "eager") << " step " << step;
  }
}

}  // namespace
