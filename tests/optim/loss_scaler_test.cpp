// Dynamic loss scaling (float16 mixed precision): known answers for unscaling, the inf/NaN flag, backoff
// and growth; a skipped step leaves parameters, optimizer state and step counter untouched; small
// gradients survive float16 only with scaling. CUDA cases skip without a GPU.
#include "optim/loss_scaler.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "core/cuda_runtime.h"
#include "core/error.h"
#include "core/factory.h"
#include "core/float16.h"
#include "core/max_relative.h"
#include "core/ops.h"
#include "layers/layer_norm.h"
#include "layers/linear.h"
#include "layers/losses.h"
#include "optim/adam.h"
#include "optim/mixed_precision.h"
#include "optim/sgd.h"

namespace dpt::optim {
namespace {

const TensorOptions kF16 = TensorOptions{}.with_dtype(DType::Float16);
constexpr double kInf = std::numeric_limits<double>::infinity();

Tensor param(const std::vector<double>& v) {
  Tensor t = from_vector(v, {static_cast<int64_t>(v.size())});
  t.requires_grad_(true);
  return t;
}

TEST(LossScaler, DefaultsAreThoseOfPyTorchsGradScaler) {
  LossScaler s;
  EXPECT_EQ(s.scale(), 65536.0);
  EXPECT_EQ(s.options().growth_factor, 2.0);
  EXPECT_EQ(s.options().backoff_factor, 0.5);
  EXPECT_EQ(s.options().growth_interval, 2000);
  EXPECT_EQ(s.growth_tracker(), 0);
}

TEST(LossScaler, ScaledLossIsFloat32AndUnscalingRestoresTheGradient) {
  LossScaler s(LossScalerOptions{.init_scale = 1024});
  Tensor loss16 = from_vector(std::vector<double>{100}, {}, kF16);
  Tensor scaled = s.scale_loss(loss16);
  EXPECT_EQ(scaled.dtype(), DType::Float32);  // 100 * 2^16 would be inf in float16
  EXPECT_EQ(scaled.item(), 102400.0);
  Tensor g = from_vector(std::vector<double>{1024, -512, 0.5, 0}, {4}, kF16);
  Tensor master = zeros({4});
  s.unscale_into(g, master);
  EXPECT_EQ(master.to_vector<double>(), (std::vector<double>{1, -0.5, 1.0 / 2048, 0}));
  EXPECT_FALSE(s.found_inf());
}

TEST(LossScaler, InfOrNanInAnyGradientIsFoundOnceAndThenCleared) {
  for (double bad : {kInf, -kInf, std::nan("")}) {
    LossScaler s;
    Tensor master_a = zeros({3}), master_b = zeros({2});
    s.unscale_into(from_vector(std::vector<double>{1, 2, 3}, {3}, kF16), master_a);
    s.unscale_into(from_vector(std::vector<double>{4, bad}, {2}, kF16), master_b);
    EXPECT_TRUE(s.found_inf()) << bad;
    EXPECT_FALSE(s.found_inf()) << "the flag is cleared by the read";
    s.unscale_into(from_vector(std::vector<double>{1, 2, 3}, {3}, kF16), master_a);
    EXPECT_FALSE(s.found_inf());
  }
  // A finite float16 gradient whose unscaled value overflows float32 counts too (scale below 1).
  LossScaler tiny(LossScalerOptions{.init_scale = 1e-36});
  Tensor m = zeros({1});
  tiny.unscale_into(from_vector(std::vector<double>{60000}, {1}, kF16), m);
  EXPECT_TRUE(tiny.found_inf());
}

TEST(LossScaler, BacksOffOnOverflowAndGrowsAfterTheIntervalOfFiniteSteps) {
  LossScaler s(LossScalerOptions{.growth_interval = 3});
  s.update(false);
  s.update(false);
  EXPECT_EQ(s.scale(), 65536.0);
  EXPECT_EQ(s.growth_tracker(), 2);
  s.update(false);
  EXPECT_EQ(s.scale(), 131072.0);  // doubled after 3 finite steps
  EXPECT_EQ(s.growth_tracker(), 0);
  s.update(false);
  s.update(true);
  EXPECT_EQ(s.scale(), 65536.0);  // halved, and the count of finite steps starts over
  EXPECT_EQ(s.growth_tracker(), 0);
  s.update(false);
  s.update(false);
  EXPECT_EQ(s.scale(), 65536.0);
  s.update(false);
  EXPECT_EQ(s.scale(), 131072.0);
  s.load(8.0, 1);
  EXPECT_EQ(s.scale(), 8.0);
  EXPECT_EQ(s.growth_tracker(), 1);
}

TEST(LossScaler, RejectsMeaninglessOptions) {
  EXPECT_THROW(LossScaler(LossScalerOptions{.init_scale = 0}), Error);
  EXPECT_THROW(LossScaler(LossScalerOptions{.growth_factor = 1}), Error);
  EXPECT_THROW(LossScaler(LossScalerOptions{.backoff_factor = 1}), Error);
  EXPECT_THROW(LossScaler(LossScalerOptions{.growth_interval = 0}), Error);
  EXPECT_THROW(MixedPrecision({{"w", param({1})}}, DType::Float64), Error);
}

// loss = sum(w * x) in float32 from a float16 model, so d loss / d w = x exactly (for x exact in fp16).
Tensor linear_loss(const Tensor& w, const std::vector<double>& x) {
  return sum(mul(w.to(DType::Float32), from_vector(x, {static_cast<int64_t>(x.size())})));
}

// One training step as dpt-train takes it; returns whether the update was applied.
bool train_step(MixedPrecision& mp, Optimizer& opt, const Tensor& w, const std::vector<double>& x) {
  w.zero_grad(true);
  opt.zero_grad();
  mp.scale_loss(linear_loss(w, x)).backward();
  const bool finite = mp.grads_to_master();
  if (finite) {
    opt.step();
    mp.masters_to_model();
  }
  mp.update_scale(!finite);
  return finite;
}

TEST(MixedPrecisionFp16, OverflowSkipsTheStepAndHalvesTheScaleLeavingEverythingUntouched) {
  Tensor w = param({0.5, -0.25, 1.0});
  MixedPrecision mp({{"w", w}}, DType::Float16);
  ASSERT_NE(mp.loss_scaler(), nullptr);
  EXPECT_EQ(w.dtype(), DType::Float16);
  const Tensor master = mp.master_params()[0].second;
  AdamW opt(mp.master_params(), AdamOptions{.lr = 0.1});

  // 1. Finite: gradients 0.25 * 65536 fit float16; the master gradient is x again.
  ASSERT_TRUE(train_step(mp, opt, w, {0.25, 0.25, 0.25}));
  EXPECT_EQ(master.grad().to_vector<double>(), (std::vector<double>{0.25, 0.25, 0.25}));
  EXPECT_EQ(opt.step_count(), 1);
  const std::vector<double> masters_after_1 = master.to_vector<double>();
  const std::vector<double> model_after_1 = w.to_vector<double>();
  const NamedTensors state_1 = opt.state_dict();
  std::vector<std::vector<double>> state_values;
  for (const auto& [name, t] : state_1) state_values.push_back(t.clone().to_vector<double>());

  // 2. 1.5 * 65536 = 98304 overflows float16 (max 65504): skipped, scale halved.
  EXPECT_FALSE(train_step(mp, opt, w, {1.5, 0.25, 0.25}));
  EXPECT_EQ(mp.loss_scale(), 32768.0);
  EXPECT_EQ(opt.step_count(), 1);
  EXPECT_EQ(master.to_vector<double>(), masters_after_1);
  EXPECT_EQ(w.to_vector<double>(), model_after_1);
  const NamedTensors state_2 = opt.state_dict();
  ASSERT_EQ(state_2.size(), state_values.size());
  for (size_t i = 0; i < state_2.size(); ++i) {
    EXPECT_EQ(state_2[i].second.to_vector<double>(), state_values[i]) << state_2[i].first;
  }

  // 3. The same gradient at the halved scale (49152) fits: applied, unscaled exactly.
  ASSERT_TRUE(train_step(mp, opt, w, {1.5, 0.25, 0.25}));
  EXPECT_EQ(master.grad().to_vector<double>(), (std::vector<double>{1.5, 0.25, 0.25}));
  EXPECT_EQ(opt.step_count(), 2);
  EXPECT_NE(master.to_vector<double>(), masters_after_1);
}

TEST(MixedPrecisionFp16, ScaleDoublesAfterGrowthIntervalFiniteSteps) {
  Tensor w = param({0.5, -0.25});
  MixedPrecision mp({{"w", w}}, DType::Float16, LossScalerOptions{.init_scale = 256, .growth_interval = 4});
  SGD opt(mp.master_params(), SgdOptions{.lr = 0.01});
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(train_step(mp, opt, w, {1, 1}));
  EXPECT_EQ(mp.loss_scale(), 256.0);
  ASSERT_TRUE(train_step(mp, opt, w, {1, 1}));
  EXPECT_EQ(mp.loss_scale(), 512.0);
  EXPECT_EQ(opt.step_count(), 4);
}

TEST(MixedPrecisionFp16, GradientsBelowTheFloat16RangeSurviveOnlyWithScaling) {
  // d loss / d w = 1e-8: under float16's smallest subnormal (2^-24 ~ 6e-8), so unscaled it is 0.
  const std::vector<double> x(4, 1e-8);
  for (double scale : {1.0, 65536.0}) {
    Tensor w = param({1, 2, 3, 4});
    MixedPrecision mp({{"w", w}}, DType::Float16, LossScalerOptions{.init_scale = scale});
    mp.scale_loss(linear_loss(w, x)).backward();
    ASSERT_TRUE(mp.grads_to_master());
    for (double g : mp.master_params()[0].second.grad().to_vector<double>()) {
      if (scale == 1.0) {
        EXPECT_EQ(g, 0.0);
      } else {
        EXPECT_NEAR(g, 1e-8, 1e-8 * 1e-3);  // 6.6e-4 in float16 keeps 11 significant bits
      }
    }
  }
}

TEST(MixedPrecisionFp16, Bf16AndFp32HaveNoScaler) {
  Tensor a = param({1}), b = param({1});
  MixedPrecision bf(NamedTensors{{"a", a}}, DType::BFloat16), fp(NamedTensors{{"b", b}}, DType::Float32);
  EXPECT_EQ(bf.loss_scaler(), nullptr);
  EXPECT_EQ(fp.loss_scaler(), nullptr);
  EXPECT_EQ(bf.loss_scale(), 1.0);
  Tensor loss = scalar_tensor(2.0);
  EXPECT_TRUE(bf.scale_loss(loss).same(loss));
}

// --- on a GPU -------------------------------------------------------------------------------------

#define SKIP_WITHOUT_GPU() \
  if (!cuda::is_available()) GTEST_SKIP() << "no CUDA device"

TEST(CudaLossScaler, UnscaleKernelMatchesTheCpuAndFlagsInfAndNan) {
  SKIP_WITHOUT_GPU();
  Generator gen(3);
  Tensor g = randn({100003}, gen, kF16, 0.0, 1000.0);  // odd length: a partial last block
  LossScaler cpu(LossScalerOptions{.init_scale = 4096}), gpu(LossScalerOptions{.init_scale = 4096});
  Tensor mc = zeros({100003}), mg = zeros({100003}, TensorOptions{}.with_device(Device::cuda(0)));
  cpu.unscale_into(g, mc);
  gpu.unscale_into(g.to(Device::cuda(0)), mg);
  EXPECT_EQ(mg.to_vector<float>(), mc.to_vector<float>());  // one exact power-of-two multiply each
  EXPECT_FALSE(gpu.found_inf());
  for (double bad : {kInf, std::nan("")}) {
    std::vector<double> v(5000, 1.0);
    v[4321] = bad;
    Tensor b = from_vector(v, {5000}, kF16.with_device(Device::cuda(0)));
    Tensor m = zeros({5000}, TensorOptions{}.with_device(Device::cuda(0)));
    gpu.unscale_into(g.to(Device::cuda(0)), mg);
    gpu.unscale_into(b, m);
    EXPECT_TRUE(gpu.found_inf()) << bad;
    EXPECT_FALSE(gpu.found_inf()) << "cleared after the read";
  }
}

// One float16 training step of a small network (Linear, LayerNorm, GELU, Linear, cross-entropy) on
// CUDA and on the CPU: the same loss, the same overflow decision, unscaled float32 master gradients
// that agree within float16 rounding, and (SGD, so the update is linear in the gradient) masters that
// agree after the update. With inputs that overflow float16 the step is skipped on both.
TEST(CudaLossScaler, Fp16TrainingStepMatchesTheCpu) {
  SKIP_WITHOUT_GPU();
  constexpr double kLr = 0.1;
  struct Run {
    double loss = 0;
    bool finite = false;
    std::vector<Tensor> grads, masters_before, masters_after;
    double scale_after = 0;
  };
  auto run = [](Device device, double input_scale) {
    Generator gen(9);
    nn::Linear fc1(64, 128, true, gen), fc2(128, 10, true, gen);
    nn::LayerNorm ln(128);
    Generator data(10);
    Tensor x = randn({32, 64}, data, TensorOptions{}, 0.0, input_scale);
    Tensor y = randint({32}, 0, 10, data, TensorOptions{}.with_dtype(DType::Int64));
    fc1.to(device);
    fc2.to(device);
    ln.to(device);
    NamedTensors params;
    for (auto* m : {static_cast<nn::Module*>(&fc1), static_cast<nn::Module*>(&ln), static_cast<nn::Module*>(&fc2)}) {
      for (const auto& [name, p] : m->named_parameters()) params.emplace_back(std::to_string(params.size()) + name, p);
    }
    MixedPrecision mp(params, DType::Float16);
    SGD opt(mp.master_params(), SgdOptions{.lr = kLr});
    Run r;
    for (const auto& [name, t] : mp.master_params()) r.masters_before.push_back(t.to(Device::cpu()).clone());
    Tensor logits = fc2.forward(gelu(ln.forward(fc1.forward(x.to(device).to(DType::Float16)))));
    Tensor loss = nn::cross_entropy_loss(logits, y.to(device));
    mp.scale_loss(loss).backward();
    r.loss = loss.item();
    r.finite = mp.grads_to_master();
    if (r.finite) {
      for (const auto& [name, t] : mp.master_params()) r.grads.push_back(t.grad().to(Device::cpu()).clone());
      opt.step();
      mp.masters_to_model();
    }
    mp.update_scale(!r.finite);
    r.scale_after = mp.loss_scale();
    for (const auto& [name, t] : mp.master_params()) r.masters_after.push_back(t.to(Device::cpu()));
    return r;
  };
  for (double input_scale : {1.0, 1e5}) {  // 1e5: inputs already overflow float16 (max 65504)
    SCOPED_TRACE(input_scale);
    Run cpu = run(Device::cpu(), input_scale), gpu = run(Device::cuda(0), input_scale);
    EXPECT_EQ(gpu.finite, cpu.finite);
    EXPECT_EQ(gpu.scale_after, cpu.scale_after);
    ASSERT_EQ(gpu.masters_after.size(), cpu.masters_after.size());
    if (!cpu.finite) {
      EXPECT_EQ(cpu.scale_after, 32768.0);
      for (size_t i = 0; i < cpu.masters_after.size(); ++i) {
        EXPECT_EQ(gpu.masters_after[i].to_vector<double>(), gpu.masters_before[i].to_vector<double>()) << i;
        EXPECT_EQ(cpu.masters_after[i].to_vector<double>(), cpu.masters_before[i].to_vector<double>()) << i;
      }
      continue;
    }
    EXPECT_NEAR(gpu.loss, cpu.loss, 1e-2 * std::abs(cpu.loss));
    ASSERT_EQ(gpu.grads.size(), cpu.grads.size());
    for (size_t i = 0; i < cpu.grads.size(); ++i) {
      EXPECT_LT(max_relative(gpu.grads[i], cpu.grads[i]), 2e-2) << "master gradient " << i;
      // masters_after = masters_before - lr * grad on both devices, so they differ by lr * the gradients'
      // difference.
      const std::vector<double> a = gpu.masters_after[i].to_vector<double>();
      const std::vector<double> b = cpu.masters_after[i].to_vector<double>();
      const std::vector<double> ga = gpu.grads[i].to_vector<double>(), gb = cpu.grads[i].to_vector<double>();
      for (size_t j = 0; j < a.size(); ++j) {
        ASSERT_NEAR(a[j] - b[j], -kLr * (ga[j] - gb[j]), 1e-6) << "master " << i << " element " << j;
      }
    }
  }
}

}  // namespace
}  // namespace dpt::optim
