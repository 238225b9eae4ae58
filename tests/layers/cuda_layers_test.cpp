// CPU vs CUDA parity of every layer: forward outputs and all gradients (GPU machine only), and the
// bf16 paths against float32 within bf16 tolerance.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>

#include "core/cuda_runtime.h"
#include "core/factory.h"
#include "core/flags.h"
#include "core/ops.h"
#include "core/ops_flash_attention.h"
#include "layers/activation.h"
#include "layers/attention.h"
#include "layers/cnn.h"
#include "layers/conv.h"
#include "layers/dropout.h"
#include "layers/embedding.h"
#include "layers/gpt.h"
#include "layers/layer_norm.h"
#include "layers/linear.h"
#include "layers/losses.h"
#include "layers/mlp.h"
#include "layers/transformer_block.h"

namespace dpt::nn {
namespace {

#define REQUIRE_GPU() \
  if (!cuda::is_available()) GTEST_SKIP() << "no CUDA device"

double max_abs_diff(const Tensor& a, const Tensor& b) {
  auto x = a.to_vector<double>(), y = b.to_vector<double>();
  EXPECT_EQ(x.size(), y.size());
  double worst = 0;
  for (size_t i = 0; i < x.size() && i < y.size(); ++i) worst = std::max(worst, std::abs(x[i] - y[i]));
  return worst;
}

// Builds the module twice from the same seed, runs the CPU copy and the CUDA copy on the same input,
// backpropagates the same weighted sum, and compares outputs, input gradients and parameter gradients.
void expect_parity(const std::function<std::shared_ptr<Module>(Generator&)>& make, const Tensor& input,
                   double tol = 1e-4) {
  Generator g1(11), g2(11);
  auto cpu = make(g1), gpu = make(g2);
  gpu->to(Device::cuda());
  const bool differentiable_input = is_floating(input.dtype());
  Tensor xc = input.clone().detach(), xg = input.to(Device::cuda()).detach();
  if (differentiable_input) {
    xc.requires_grad_(true);
    xg.requires_grad_(true);
  }
  Tensor yc = cpu->forward(xc), yg = gpu->forward(xg);
  EXPECT_LE(max_abs_diff(yc, yg), tol) << "forward";
  Generator wgen(5);
  Tensor w = rand(yc.shape(), wgen, {}, 0.5, 1.5);
  sum(yc * w).backward();
  sum(yg * w.to(Device::cuda())).backward();
  if (differentiable_input) {
    EXPECT_LE(max_abs_diff(xc.grad(), xg.grad()), tol) << "input gradient";
  }
  auto pc = cpu->named_parameters(), pg = gpu->named_parameters();
  for (size_t i = 0; i < pc.size(); ++i) {
    ASSERT_TRUE(pc[i].second.grad().defined() && pg[i].second.grad().defined()) << pc[i].first;
    EXPECT_LE(max_abs_diff(pc[i].second.grad(), pg[i].second.grad()), tol) << pc[i].first;
  }
}

TEST(CudaLayers, LinearEmbeddingLayerNormActivations) {
  REQUIRE_GPU();
  Generator gen(1);
  Tensor x = randn({3, 5, 16}, gen);
  expect_parity([](Generator& g) { return std::make_shared<Linear>(16, 8, true, g); }, x);
  expect_parity([](Generator&) { return std::make_shared<LayerNorm>(16); }, x);
  for (const char* act : {"relu", "gelu", "tanh"})
    expect_parity([act](Generator&) { return make_activation(act); }, x);
  Tensor idx = randint({4, 7}, 0, 50, gen, TensorOptions{}.with_dtype(DType::Int64));
  expect_parity([](Generator& g) { return std::make_shared<Embedding>(50, 8, g); }, idx);
}

TEST(CudaLayers, DropoutDrawsTheSameMaskOnBothDevices) {
  REQUIRE_GPU();
  Generator gen(2);
  Tensor x = randn({64, 33}, gen);
  expect_parity([](Generator& g) { return std::make_shared<Dropout>(0.3, g); }, x, 1e-6);
  // dropout_add in bfloat16 from an offset no multiple of the Philox group: the same bits on both.
  Generator on_cpu(9), on_gpu(9);
  on_cpu.set_state(9, 13);
  on_gpu.set_state(9, 13);
  const TensorOptions bf16 = TensorOptions{}.with_dtype(DType::BFloat16);
  Tensor a = randn({1001}, gen, bf16), r = randn({1001}, gen, bf16);
  Tensor yc = dropout_add(a, r, 0.2, on_cpu), yg = dropout_add(a.to(Device::cuda()), r.to(Device::cuda()), 0.2, on_gpu);
  EXPECT_EQ(yc.to_vector<double>(), yg.to(Device::cpu()).to_vector<double>());
}

TEST(CudaLayers, MlpAttentionBlock) {
  REQUIRE_GPU();
  Generator gen(3);
  expect_parity([](Generator& g) { return std::make_shared<MLP>(std::vector<int64_t>{16, 32, 4}, "gelu", g); },
                randn({10, 16}, gen));
  Tensor x = randn({2, 9, 16}, gen);
  expect_parity([](Generator& g) { return std::make_shared<CausalSelfAttention>(16, 4, 0.0, g); }, x);
  expect_parity([](Generator& g) { return std::make_shared<TransformerBlock>(16, 4, 0.1, g); }, x);
}

TEST(CudaLayers, ConvPoolCnn) {
  REQUIRE_GPU();
  Generator gen(4);
  Tensor x = randn({2, 3, 8, 8}, gen);
  expect_parity([](Generator& g) { return std::make_shared<Conv2d>(3, 5, 3, 2, 1, true, g); }, x);
  expect_parity([](Generator&) { return std::make_shared<MaxPool2d>(3, 2, 1); }, x);
  expect_parity([](Generator&) { return std::make_shared<AvgPool2d>(2, 2, 1); }, x);
  CNNConfig cfg;
  cfg.in_channels = 3;
  cfg.height = cfg.width = 8;
  cfg.width_multiplier = 4;
  expect_parity([cfg](Generator& g) { return std::make_shared<CNN>(cfg, g); }, x);
}

GPTConfig small_gpt() {
  GPTConfig c;
  c.vocab_size = 64;
  c.block_size = 16;
  c.n_layer = 2;
  c.n_head = 4;
  c.n_embd = 32;
  return c;
}

TEST(CudaLayers, GptLossAndGradients) {
  REQUIRE_GPU();
  Generator gen(5);
  Tensor idx = randint({3, 16}, 0, 64, gen, TensorOptions{}.with_dtype(DType::Int64));
  Tensor tgt = randint({3, 16}, 0, 64, gen, TensorOptions{}.with_dtype(DType::Int64));
  Generator g1(9), g2(9);
  GPT cpu(small_gpt(), g1), gpu(small_gpt(), g2);
  gpu.to(Device::cuda());
  Tensor lc = cpu.loss(idx, tgt), lg = gpu.loss(idx.to(Device::cuda()), tgt.to(Device::cuda()));
  EXPECT_NEAR(lc.item(), lg.item(), 1e-5);
  lc.backward();
  lg.backward();
  auto pc = cpu.named_parameters(), pg = gpu.named_parameters();
  for (size_t i = 0; i < pc.size(); ++i)
    EXPECT_LE(max_abs_diff(pc[i].second.grad(), pg[i].second.grad()), 1e-5) << pc[i].first;
}

TEST(CudaLayers, Bf16GptAndCnnStayWithinBf16ToleranceOfFloat32) {
  REQUIRE_GPU();
  Generator gen(6);
  Tensor idx = randint({4, 16}, 0, 64, gen, TensorOptions{}.with_dtype(DType::Int64)).to(Device::cuda());
  Tensor tgt = randint({4, 16}, 0, 64, gen, TensorOptions{}.with_dtype(DType::Int64)).to(Device::cuda());
  Generator g1(9), g2(9);
  GPT f32(small_gpt(), g1), b16(small_gpt(), g2);
  f32.to(Device::cuda());
  b16.to(Device::cuda());
  b16.to(DType::BFloat16);
  double a = f32.loss(idx, tgt).item(), b = b16.loss(idx, tgt).item();
  EXPECT_NEAR(a, b, 0.02 * a);

  CNNConfig cfg;
  cfg.height = cfg.width = 8;
  Generator g3(2), g4(2);
  CNN c32(cfg, g3), c16(cfg, g4);
  c32.to(Device::cuda());
  c16.to(Device::cuda());
  c16.to(DType::BFloat16);
  Tensor x = randn({4, 1, 8, 8}, gen).to(Device::cuda());
  Tensor y32 = c32.forward(x), y16 = c16.forward(x.to(DType::BFloat16));
  EXPECT_LE(max_abs_diff(y32, y16), 0.05);
}

// Attention dropout inside our bf16 kernels draws the mask the composed path draws for the [B, H, T, T]
// weights: the CPU's float32 composition with the same generator state is the reference for the output and
// every gradient, within bf16 rounding. T = 80 is no multiple of the kernels' tiles; a wrong mask index or a
// mask missing from one of the three kernels moves values by whole weights, far beyond the tolerance.
TEST(CudaLayers, FusedAttentionDropoutDrawsTheComposedPathsMask) {
  REQUIRE_GPU();
  ScopedFlag ours(Flag::Attention, "flash");  // cuDNN's engines draw their own mask (sdpa_cudnn_test.cpp)
  Generator gen(3);
  Tensor x = randn({2, 80, 128}, gen);
  Generator g1(11), g2(11), g3(11);
  auto cpu = std::make_shared<CausalSelfAttention>(128, 2, 0.3, g1);
  auto gpu = std::make_shared<CausalSelfAttention>(128, 2, 0.3, g2);
  auto gpu_no_drop = std::make_shared<CausalSelfAttention>(128, 2, 0.0, g3);
  for (auto& m : {gpu, gpu_no_drop}) {
    m->to(Device::cuda());
    m->to(DType::BFloat16);
  }
  ASSERT_TRUE(causal_attention_dropout_fused(Tensor::empty({2, 80, 384}, TensorOptions{}.with_dtype(DType::BFloat16)
                                                                              .with_device(Device::cuda())),
                                             2));
  Tensor xc = x.clone().detach(), xg = x.to(Device::cuda()).to(DType::BFloat16).detach();
  xc.requires_grad_(true);
  xg.requires_grad_(true);
  Tensor yc = cpu->forward(xc), yg = gpu->forward(xg);
  const double scale = max_abs_diff(yc, zeros_like(yc));
  EXPECT_LE(max_abs_diff(yc, yg.to(DType::Float32)), 0.03 * scale) << "forward";
  EXPECT_GE(max_abs_diff(yg.to(DType::Float32), gpu_no_drop->forward(xg.detach()).to(DType::Float32)), 0.2 * scale)
      << "dropout changed nothing";
  Generator wgen(5);
  Tensor w = rand(yc.shape(), wgen, {}, 0.5, 1.5);
  sum(yc * w).backward();
  sum(yg * w.to(Device::cuda()).to(DType::BFloat16)).backward();
  const double gscale = max_abs_diff(xc.grad(), zeros_like(xc.grad()));
  EXPECT_LE(max_abs_diff(xc.grad(), xg.grad().to(DType::Float32)), 0.03 * gscale) << "input gradient";
  auto pc = cpu->named_parameters(), pg = gpu->named_parameters();
  for (size_t i = 0; i < pc.size(); ++i) {
    const double ps = max_abs_diff(pc[i].second.grad(), zeros_like(pc[i].second.grad()));
    EXPECT_LE(max_abs_diff(pc[i].second.grad(), pg[i].second.grad().to(DType::Float32)), 0.03 * ps) << pc[i].first;
  }
  EXPECT_EQ(g1.offset(), g2.offset()) << "the fused path drew another amount of numbers";
}

}  // namespace
}  // namespace dpt::nn
