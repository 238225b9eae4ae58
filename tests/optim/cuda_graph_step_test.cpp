// A training step captured in a CUDA graph and replayed must be the eager step, bit for bit: capture
// changes who launches the kernels, not the arithmetic. Also: the step number counted on the device
// (Adam::count_steps_on_device) equals the host's, and the graph's memory lives as long as its tensors.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "core/cuda_runtime.h"
#include "core/error.h"
#include "core/factory.h"
#include "core/ops.h"
#include "layers/gpt.h"
#include "optim/adam.h"
#include "optim/mixed_precision.h"

namespace dpt::optim {
namespace {

#define REQUIRE_GPU() \
  if (!cuda::is_available()) GTEST_SKIP() << "no CUDA device"

nn::GPTConfig small_gpt() {
  nn::GPTConfig c;
  c.vocab_size = 128;
  c.block_size = 64;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_embd = 128;  // head size 64, as GPT-2: the fused attention kernels run
  return c;
}

// A bf16 GPT with float32 masters updated by the fused AdamW, as dpt-bench train runs it.
struct Trainer {
  std::shared_ptr<nn::GPT> model;
  std::unique_ptr<MixedPrecision> mp;
  std::unique_ptr<AdamW> opt;
  Tensor x, y;

  explicit Trainer(bool steps_on_device) {
    Generator gen(3);
    model = std::make_shared<nn::GPT>(small_gpt(), gen);
    model->to(Device::cuda());
    mp = std::make_unique<MixedPrecision>(model->named_parameters(), DType::BFloat16);
    AdamOptions o;
    o.lr = 1e-3;
    o.beta2 = 0.95;
    opt = std::make_unique<AdamW>(weight_decay_groups(mp->master_params(), 0.1), o);
    mp->fuse_with(*opt);
    if (steps_on_device) opt->count_steps_on_device();
    Generator data(4);
    const TensorOptions on_gpu = TensorOptions{}.with_device(Device::cuda());
    x = randint({4, 64}, 0, 128, data, on_gpu.with_dtype(DType::Int32));
    y = randint({4, 64}, 0, 128, data, on_gpu.with_dtype(DType::Int64));
  }

  Tensor step() {
    model->zero_grad();
    Tensor loss = model->loss(x, y);
    loss.backward();
    opt->step();
    return loss;
  }
};

void expect_same_parameters(const Trainer& a, const Trainer& b) {
  const auto pa = a.mp->master_params(), pb = b.mp->master_params();
  ASSERT_EQ(pa.size(), pb.size());
  for (size_t i = 0; i < pa.size(); ++i) {
    EXPECT_EQ(pa[i].second.to(Device::cpu()).to_vector<float>(), pb[i].second.to(Device::cpu()).to_vector<float>())
        << "master " << pa[i].first;
  }
  const auto ta = a.model->named_parameters(), tb = b.model->named_parameters();
  for (size_t i = 0; i < ta.size(); ++i) {
    EXPECT_EQ(ta[i].second.to(Device::cpu()).to(DType::Float32).to_vector<float>(),
              tb[i].second.to(Device::cpu()).to(DType::Float32).to_vector<float>())
        << "bf16 twin " << ta[i].first;
  }
}

TEST(CudaGraphStep, StepCountedOnTheDeviceEqualsTheHostCount) {
  REQUIRE_GPU();
  Trainer host(false), device(true);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(host.step().item(), device.step().item()) << "step " << i;
  expect_same_parameters(host, device);
}

TEST(CudaGraphStep, ReplayedStepsEqualEagerSteps) {
  REQUIRE_GPU();
  Trainer eager(true), replayed(true);
  std::vector<double> eager_losses, replayed_losses;
  for (int i = 0; i < 6; ++i) eager_losses.push_back(eager.step().item());

  replayed_losses.push_back(replayed.step().item());  // one eager step: gradients and cuBLASLt choices exist
  Tensor loss;
  {
    cuda::CudaGraph graph;
    graph.capture([&] { loss = replayed.step(); });  // records step 2; nothing runs yet
    for (int i = 1; i < 6; ++i) {
      graph.replay();
      replayed_losses.push_back(loss.item());
    }
    EXPECT_GT(graph.memory_reserved(), 0u);
  }
  EXPECT_EQ(eager_losses, replayed_losses);
  EXPECT_LT(replayed_losses.back(), replayed_losses.front()) << "training did not progress";
  expect_same_parameters(eager, replayed);
  // The graph is gone but `loss` still holds its block: still readable.
  EXPECT_EQ(loss.item(), replayed_losses.back());
}

TEST(CudaGraphStep, GraphOutputsAreRewrittenByEachReplayAndOutliveTheGraph) {
  REQUIRE_GPU();
  Tensor x = full({1000}, 1.0f, TensorOptions{}.with_device(Device::cuda()));
  Tensor y;
  auto graph = std::make_unique<cuda::CudaGraph>();
  graph->capture([&] { y = (x * 3.0) + 1.0; });  // temporaries of the capture are freed inside it
  graph->replay();
  EXPECT_EQ(y.to(Device::cpu()).to_vector<float>(), std::vector<float>(1000, 4.0f));
  x.copy_(full({1000}, 2.0f, TensorOptions{}.with_device(Device::cuda())));
  graph->replay();
  EXPECT_EQ(y.to(Device::cpu()).to_vector<float>(), std::vector<float>(1000, 7.0f));
  graph.reset();
  // New allocations must not land on y's block, which the retired graph still reserves for y.
  Tensor z = full({1000}, 5.0f, TensorOptions{}.with_device(Device::cuda()));
  EXPECT_EQ(y.to(Device::cpu()).to_vector<float>(), std::vector<float>(1000, 7.0f));
  EXPECT_EQ(z.to(Device::cpu()).to_vector<float>(), std::vector<float>(1000, 5.0f));
}

TEST(CudaGraphStep, HostSynchronisationInsideACaptureIsAnErrorNotAHang) {
  REQUIRE_GPU();
  Tensor x = full({16}, 1.0f, TensorOptions{}.with_device(Device::cuda()));
  cuda::CudaGraph graph;
  EXPECT_THROW(graph.capture([&] { (void)sum(x).item(); }), Error);
  // The stream works normally afterwards.
  EXPECT_EQ(sum(x * 2.0).item(), 32.0);
}

}  // namespace
}  // namespace dpt::optim
