// cuDNN's fused attention for causal_attention_qkv (core/cuda/sdpa_cudnn.h): its forward must write the
// output and the logsumexp our own kernels write, and its backward the gradients of the reference, checked
// against the CPU reference in float64 on the packed layout GPT-2 uses; and the op must train the same
// with cuDNN on and off.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "core/autograd.h"
#include "core/cuda_runtime.h"
#include "core/factory.h"
#include "core/flash_attention_kernels.h"
#include "core/ops.h"
#include "core/ops_flash_attention.h"
#include "linear_switches.h"
#include "max_relative.h"
#include "scoped_env.h"

#ifdef DPT_HAVE_CUDA
#include "core/cuda/sdpa_cudnn.h"
#endif

namespace dpt {
namespace {

[[maybe_unused]] std::string shape_name(int64_t b, int64_t t, int64_t h, int64_t d) {
  return "B=" + std::to_string(b) + " T=" + std::to_string(t) + " H=" + std::to_string(h) + " D=" + std::to_string(d);
}

#ifdef DPT_HAVE_CUDA
// The cuDNN forward called directly on a packed [B, T, 3C] bfloat16 projection against the CPU reference
// kernel on the same values in float64: output within bfloat16 rounding, logsumexp within float32
// accumulation. T = 200 is no multiple of any tile. Head sizes 64 (GPT-2) and 128 must have an engine on
// the GPUs we train on; a head size without one must leave the output untouched and say so.
TEST(CudnnAttention, ForwardWritesTheOutputAndLogsumexpOfTheReference) {
  if (!cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const int64_t b = 2, t = 200, h = 3;
  for (int64_t d : {64, 128}) {
    const std::string what = shape_name(b, t, h, d);
    Generator gen(70 + d);
    const int64_t c = h * d, bh = b * h;
    const double scale = 1.0 / std::sqrt(static_cast<double>(d));
    const AttentionLayouts layouts = AttentionLayouts::packed_qkv(h, t, d);
    Tensor qkv = randn({b, t, 3 * c}, gen, TensorOptions{}.with_dtype(DType::BFloat16));

    Tensor qkv_gpu = qkv.to(Device::cuda(0));
    Tensor out = zeros({b, t, c}, qkv_gpu.options());
    Tensor lse = zeros({b, h, t}, qkv_gpu.options().with_dtype(DType::Float32));
    ASSERT_TRUE(cuda_kernels::sdpa_forward_cudnn(qkv_gpu, qkv_gpu, qkv_gpu, out, lse, layouts, bh, t, d, scale))
        << "cuDNN has no engine for " << what;

    Tensor qkv64 = qkv.to(DType::Float64);
    Tensor ref_out = zeros({b, t, c}, qkv64.options()), ref_lse = zeros({b, h, t}, qkv64.options());
    cpu::flash_attention_forward_strided(qkv64, qkv64, qkv64, ref_out, ref_lse, layouts, bh, t, d, scale);

    EXPECT_LT(max_relative(out.to(Device::cpu()), ref_out, 1.0), 1e-2) << "output " << what;
    // lse is O(1..10): an absolute bound, the scores' own float32 rounding.
    EXPECT_LT(max_relative(lse.to(Device::cpu()), ref_lse, 1.0), 1e-4) << "logsumexp " << what;
  }
}

// The cuDNN backward called directly, in both of its graphs, against the CPU reference backward in
// float64 on the same values. Each graph runs twice with different output gradients: a float32 dQ
// accumulator that was not cleared between calls (its memory comes from the pool, holding the last
// call's sums) would show in the second. The deterministic graph must repeat itself bit for bit.
TEST(CudnnAttention, BackwardWritesTheGradientsOfTheReference) {
  if (!cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const int64_t b = 2, t = 200, h = 3, d = 64, c = h * d, bh = b * h;
  const double scale = 0.125;
  const AttentionLayouts layouts = AttentionLayouts::packed_qkv(h, t, d);
  Generator gen(91);
  const TensorOptions bf16 = TensorOptions{}.with_dtype(DType::BFloat16);
  Tensor qkv = randn({b, t, 3 * c}, gen, bf16);
  Tensor qkv_gpu = qkv.to(Device::cuda(0));
  Tensor out = zeros({b, t, c}, qkv_gpu.options());
  Tensor lse = zeros({b, h, t}, qkv_gpu.options().with_dtype(DType::Float32));
  ASSERT_TRUE(cuda_kernels::sdpa_forward_cudnn(qkv_gpu, qkv_gpu, qkv_gpu, out, lse, layouts, bh, t, d, scale));

  // The reference backward from the same (rounded) output and statistics, in float64.
  auto reference = [&](const Tensor& gout) {
    Tensor q64 = qkv.to(DType::Float64), o64 = out.to(Device::cpu()).to(DType::Float64);
    Tensor g64 = gout.to(DType::Float64), lse64 = lse.to(Device::cpu()).to(DType::Float64);
    Tensor grad = zeros({b, t, 3 * c}, q64.options());
    cpu::flash_attention_backward_strided(q64, q64, q64, o64, g64, lse64, grad, grad, grad, layouts, bh, t, d, scale,
                                          Tensor());
    return grad;
  };
  auto cudnn = [&](const Tensor& gout) {
    Tensor grad = zeros({b, t, 3 * c}, qkv_gpu.options());
    Tensor g = gout.to(Device::cuda(0));
    EXPECT_TRUE(cuda_kernels::sdpa_backward_cudnn(qkv_gpu, qkv_gpu, qkv_gpu, out, g, lse, grad, grad, grad, layouts, bh,
                                                  t, d, scale));
    return grad.to(Device::cpu());
  };
  for (std::string mode : {"deterministic", "accumulate"}) {
    ScopedEnv env("DPT_CUDNN_ATTENTION_BACKWARD", mode.c_str());
    for (int call = 0; call < 2; ++call) {
      Tensor gout = randn({b, t, c}, gen, bf16);
      Tensor got = cudnn(gout);
      EXPECT_LT(max_relative(got, reference(gout), 1.0), 2e-2) << mode << " call " << call;
      if (mode != "accumulate") {
        EXPECT_TRUE(cudnn(gout).to_vector<double>() == got.to_vector<double>()) << "repeat, call " << call;
      }
    }
  }
}
#endif

// The op with cuDNN's forward and with ours: outputs within bfloat16 rounding of each other, gradients
// (our backward on each forward's output and statistics) too, and both near float64 on the CPU.
TEST(CudnnAttention, CausalAttentionQkvTrainsTheSameWithCudnnOnAndOff) {
  if (!cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const int64_t b = 2, t = 256, h = 4, d = 64, c = h * d;
  const double scale = 0.125;
  Generator gen(81);
  TensorOptions opts = TensorOptions{}.with_dtype(DType::BFloat16);
  Tensor qkv = randn({b, t, 3 * c}, gen, opts), g = randn({b, t, c}, gen, opts);
  struct Outcome {
    Tensor out, grad;
  };
  auto run = [&](const Tensor& x, const Tensor& gout, Device device) {
    Tensor leaf = x.to(device).detach().clone().requires_grad_();
    Tensor out = causal_attention_qkv(leaf, h, scale);
    out.backward(gout.to(device));
    return Outcome{out.to(Device::cpu()), leaf.grad().to(Device::cpu())};
  };
  Outcome with_cudnn, without;
  {
    CudnnAttentionSwitch on(true);
    with_cudnn = run(qkv, g, Device::cuda(0));
  }
  {
    CudnnAttentionSwitch off(false);
    without = run(qkv, g, Device::cuda(0));
  }
  Outcome ref = run(qkv.to(DType::Float64), g.to(DType::Float64), Device::cpu());
  EXPECT_LT(max_relative(with_cudnn.out, without.out, 1.0), 1e-2);
  EXPECT_LT(max_relative(with_cudnn.grad, without.grad, 1.0), 2e-2);
  EXPECT_LT(max_relative(with_cudnn.out, ref.out, 1.0), 1e-2);
  EXPECT_LT(max_relative(with_cudnn.grad, ref.grad, 1.0), 2e-2);
}

// Without autograd (evaluation, sampling a token at a time: a new length each call) the op runs our
// kernels, so it needs no cuDNN plan per length: bitwise the result with cuDNN switched off.
TEST(CudnnAttention, ForwardWithoutAutogradRunsOurKernels) {
  if (!cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const int64_t b = 1, h = 2, d = 64, c = h * d;
  Generator gen(97);
  NoGradGuard no_grad;
  for (int64_t t : {5, 6, 7}) {
    Tensor qkv = randn({b, t, 3 * c}, gen, TensorOptions{}.with_dtype(DType::BFloat16)).to(Device::cuda(0));
    Tensor with_switch_on, with_switch_off;
    {
      CudnnAttentionSwitch on(true);
      with_switch_on = causal_attention_qkv(qkv, h, 0.125).to(Device::cpu());
    }
    {
      CudnnAttentionSwitch off(false);
      with_switch_off = causal_attention_qkv(qkv, h, 0.125).to(Device::cpu());
    }
    EXPECT_TRUE(with_switch_on.to_vector<double>() == with_switch_off.to_vector<double>()) << "T = " << t;
  }
}

TEST(CudnnAttention, SwitchFollowsTheSetterAndRestores) {
  const bool before = cudnn_attention_enabled();
  {
    CudnnAttentionSwitch off(false);
    EXPECT_FALSE(cudnn_attention_enabled());
    CudnnAttentionSwitch on(true);
    EXPECT_TRUE(cudnn_attention_enabled());
  }
  EXPECT_EQ(cudnn_attention_enabled(), before);
}

}  // namespace
}  // namespace dpt
