// CUDA fused optimizer updates against the CPU loops (GPU machine only).
#include <gtest/gtest.h>

#include "core/cuda_runtime.h"
#include "core/factory.h"
#include "optim/adam.h"
#include "optim/grad_clip.h"
#include "optim/sgd.h"

namespace dpt::optim {
namespace {

// Many tensors of awkward sizes, including ones spanning several chunks and more tensors and chunks
// than one launch holds, so the multi-tensor packing is exercised across launch boundaries.
std::vector<int64_t> awkward_sizes() {
  std::vector<int64_t> sizes;
  for (int i = 0; i < 150; ++i) sizes.push_back(1 + (i * 7919) % 3001);
  sizes.push_back(65536 * 700 + 13);  // > 640 chunks: splits inside one tensor
  sizes.push_back(65536);
  sizes.push_back(1);
  return sizes;
}

struct Twin {
  NamedTensors cpu, gpu;
};

Twin make_params(uint64_t seed) {
  Generator gen(seed);
  Twin tw;
  auto sizes = awkward_sizes();
  for (size_t i = 0; i < sizes.size(); ++i) {
    Tensor p = randn({sizes[i]}, gen), g = randn({sizes[i]}, gen);
    Tensor pc = p.clone(), pg = p.to(Device::cuda());
    pc.requires_grad_(true);
    pg.requires_grad_(true);
    pc.set_grad(g.clone());
    pg.set_grad(g.to(Device::cuda()));
    std::string name = "p";
    name += std::to_string(i);
    tw.cpu.emplace_back(name, pc);
    tw.gpu.emplace_back(name, pg);
  }
  return tw;
}

void expect_close(const NamedTensors& a, const NamedTensors& b, double tol) {
  for (size_t i = 0; i < a.size(); ++i) {
    auto x = a[i].second.to_vector<float>(), y = b[i].second.to_vector<float>();
    ASSERT_EQ(x.size(), y.size());
    double worst = 0;
    for (size_t j = 0; j < x.size(); ++j) worst = std::max(worst, static_cast<double>(std::abs(x[j] - y[j])));
    EXPECT_LE(worst, tol) << a[i].first;
  }
}

TEST(CudaOptimizers, FusedAdamWMatchesCpu) {
  if (!cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  Twin tw = make_params(1);
  AdamOptions o;
  o.lr = 1e-2;
  AdamW cpu(weight_decay_groups(tw.cpu, 0.1), o), gpu(weight_decay_groups(tw.gpu, 0.1), o);
  for (int s = 0; s < 3; ++s) {
    cpu.step();
    gpu.step();
  }
  expect_close(tw.cpu, tw.gpu, 1e-5);
}

TEST(CudaOptimizers, FusedSgdNesterovMatchesCpu) {
  if (!cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  Twin tw = make_params(2);
  SgdOptions o{0.05, 0.9, true, 0.01};
  SGD cpu(tw.cpu, o), gpu(tw.gpu, o);
  for (int s = 0; s < 3; ++s) {
    cpu.step();
    gpu.step();
  }
  expect_close(tw.cpu, tw.gpu, 1e-5);
}

TEST(CudaOptimizers, FusedGradClipMatchesCpu) {
  if (!cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  Twin tw = make_params(3);
  double a = clip_grad_norm(tw.cpu, 1.0), b = clip_grad_norm(tw.gpu, 1.0);
  EXPECT_NEAR(a, b, 1e-5 * a);
  NamedTensors gc, gg;
  for (size_t i = 0; i < tw.cpu.size(); ++i) {
    gc.emplace_back(tw.cpu[i].first, tw.cpu[i].second.grad());
    gg.emplace_back(tw.gpu[i].first, tw.gpu[i].second.grad());
  }
  expect_close(gc, gg, 1e-7);
}

}  // namespace
}  // namespace dpt::optim
