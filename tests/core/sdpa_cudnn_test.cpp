// cuDNN's fused attention for causal_attention_qkv (core/cuda/sdpa_cudnn.h): its forward must write the
// output and the logsumexp our own kernels write, and its backward the gradients of the reference, checked
// against the CPU reference in float64 on the packed layout GPT-2 uses; and the op must train the same
// with cuDNN (DPT_ATTENTION=auto) and without (flash: our kernels; reference: the composed path).
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "core/autograd.h"
#include "core/cuda_runtime.h"
#include "core/factory.h"
#include "core/flags.h"
#include "core/flash_attention_kernels.h"
#include "core/ops.h"
#include "core/ops_flash_attention.h"
#include "max_relative.h"

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

// The cuDNN backward called directly against the CPU reference backward in float64 on the same values,
// twice with different output gradients (scratch that kept the last call's values would show in the
// second), and each call repeated: the backward must give the same bits every time.
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
  for (int call = 0; call < 2; ++call) {
    Tensor gout = randn({b, t, c}, gen, bf16);
    Tensor got = cudnn(gout);
    EXPECT_LT(max_relative(got, reference(gout), 1.0), 2e-2) << "call " << call;
    EXPECT_TRUE(cudnn(gout).to_vector<double>() == got.to_vector<double>()) << "repeat, call " << call;
  }
}
#endif

// The op on each path DPT_ATTENTION selects (auto: cuDNN's forward and backward; flash: our kernels;
// reference: the composed path): outputs and gradients within bfloat16 rounding of each other and of
// float64 on the CPU.
TEST(CudnnAttention, CausalAttentionQkvTrainsTheSameOnEveryPath) {
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
  auto on_path = [&](const char* path) {
    ScopedFlag flag(Flag::Attention, path);
    return run(qkv, g, Device::cuda(0));
  };
  const Outcome with_cudnn = on_path("auto"), ours = on_path("flash"), composed = on_path("reference");
  const Outcome ref = run(qkv.to(DType::Float64), g.to(DType::Float64), Device::cpu());
  EXPECT_LT(max_relative(with_cudnn.out, ours.out, 1.0), 1e-2);
  EXPECT_LT(max_relative(with_cudnn.grad, ours.grad, 1.0), 2e-2);
  EXPECT_LT(max_relative(with_cudnn.out, ref.out, 1.0), 1e-2);
  EXPECT_LT(max_relative(with_cudnn.grad, ref.grad, 1.0), 2e-2);
  EXPECT_LT(max_relative(ours.out, ref.out, 1.0), 1e-2);
  EXPECT_LT(max_relative(ours.grad, ref.grad, 1.0), 2e-2);
  EXPECT_LT(max_relative(composed.out, ref.out, 1.0), 2e-2);
  EXPECT_LT(max_relative(composed.grad, ref.grad, 1.0), 5e-2);  // bfloat16 scores and dS in memory
}

// Without autograd (evaluation, sampling a token at a time: a new length each call) the op runs our
// kernels, so it needs no cuDNN plan per length: bitwise the result with cuDNN switched off
// (DPT_ATTENTION=flash).
TEST(CudnnAttention, ForwardWithoutAutogradRunsOurKernels) {
  if (!cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const int64_t b = 1, h = 2, d = 64, c = h * d;
  Generator gen(97);
  NoGradGuard no_grad;
  for (int64_t t : {5, 6, 7}) {
    Tensor qkv = randn({b, t, 3 * c}, gen, TensorOptions{}.with_dtype(DType::BFloat16)).to(Device::cuda(0));
    auto on_path = [&](const char* path) {
      ScopedFlag flag(Flag::Attention, path);
      return causal_attention_qkv(qkv, h, 0.125).to(Device::cpu()).to_vector<double>();
    };
    EXPECT_TRUE(on_path("auto") == on_path("flash")) << "T = " << t;
  }
}

}  // namespace
}  // namespace dpt
