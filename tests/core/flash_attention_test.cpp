// Fused causal attention: float64 finite differences, agreement with the composed path
// matmul -> causal_softmax -> matmul, causality, and CPU-vs-CUDA parity of the forward and all three
// gradients (float32 within 1e-4, bfloat16 within 2e-2, relative to the largest reference value). On
// CUDA bfloat16 runs our mma.sync kernels and every other case the composed path; both are held to the
// CPU reference kernels here.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <string>
#include <tuple>

#include "core/cuda_runtime.h"
#include "core/error.h"
#include "core/factory.h"
#include "core/flags.h"
#include "core/ops.h"
#include "core/ops_attention.h"
#include "core/ops_flash_attention.h"
#include "gradcheck.h"
#include "max_relative.h"

using namespace dpt;

namespace {

Tensor composed_attention(const Tensor& q, const Tensor& k, const Tensor& v, double scale) {
  return matmul(causal_softmax(matmul(q, k, false, true), scale), v);
}

struct Outcome {
  Tensor out, gq, gk, gv;
};

// Output and gradients of sum(out * g) for fresh leaves made from q, k, v on `device`.
template <class F>
Outcome run(F&& attention, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g, Device device) {
  Tensor ql = q.to(device).detach().clone().requires_grad_();
  Tensor kl = k.to(device).detach().clone().requires_grad_();
  Tensor vl = v.to(device).detach().clone().requires_grad_();
  Tensor out = attention(ql, kl, vl);
  out.backward(g.to(device));
  return {out.to(Device::cpu()), ql.grad().to(Device::cpu()), kl.grad().to(Device::cpu()), vl.grad().to(Device::cpu())};
}

void expect_close(const Outcome& got, const Outcome& want, double tol, const std::string& what, double floor = 1e-30) {
  EXPECT_LT(max_relative(got.out, want.out, floor), tol) << "output " << what;
  EXPECT_LT(max_relative(got.gq, want.gq, floor), tol) << "grad q " << what;
  EXPECT_LT(max_relative(got.gk, want.gk, floor), tol) << "grad k " << what;
  EXPECT_LT(max_relative(got.gv, want.gv, floor), tol) << "grad v " << what;
}

const TensorOptions kF64 = TensorOptions{}.with_dtype(DType::Float64);

}  // namespace

TEST(CausalAttention, GradientsMatchFiniteDifferencesInFloat64) {
  Generator gen(11);
  Tensor q = randn({1, 2, 5, 4}, gen, kF64), k = randn({1, 2, 5, 4}, gen, kF64), v = randn({1, 2, 5, 4}, gen, kF64);
  expect_gradients_match([](const std::vector<Tensor>& in) { return causal_attention(in[0], in[1], in[2], 0.6); },
                         {q, k, v}, 1e-6);
}

TEST(CausalAttention, EqualsComposedPathForwardAndBackwardForStridedInputs) {
  Generator gen(12);
  // [B, T, H, D] permuted to [B, H, T, D], as attention.cpp splits heads: non-contiguous inputs.
  Tensor q = randn({2, 9, 3, 8}, gen, kF64).permute({0, 2, 1, 3});
  Tensor k = randn({2, 9, 3, 8}, gen, kF64).permute({0, 2, 1, 3});
  Tensor v = randn({2, 9, 3, 8}, gen, kF64).permute({0, 2, 1, 3});
  Tensor g = randn({2, 3, 9, 8}, gen, kF64);
  const double scale = 1.0 / std::sqrt(8.0);
  Outcome fused =
      run([&](auto a, auto b, auto c) { return causal_attention(a, b, c, scale); }, q, k, v, g, Device::cpu());
  Outcome ref =
      run([&](auto a, auto b, auto c) { return composed_attention(a, b, c, scale); }, q, k, v, g, Device::cpu());
  EXPECT_EQ(fused.out.shape(), (Shape{2, 3, 9, 8}));
  expect_close(fused, ref, 1e-12, "float64");
}

TEST(CausalAttention, Float32Bfloat16AndFloat16FollowFloat64) {
  Generator gen(13);
  Tensor q = randn({1, 2, 33, 16}, gen, kF64), k = randn({1, 2, 33, 16}, gen, kF64);
  Tensor v = randn({1, 2, 33, 16}, gen, kF64), g = randn({1, 2, 33, 16}, gen, kF64);
  auto attention = [](auto a, auto b, auto c) { return causal_attention(a, b, c, 0.25); };
  Outcome ref = run(attention, q, k, v, g, Device::cpu());
  for (auto [dtype, tol] :
       {std::pair{DType::Float32, 1e-5}, std::pair{DType::BFloat16, 2e-2}, std::pair{DType::Float16, 4e-3}}) {
    Outcome low = run(attention, q.to(dtype), k.to(dtype), v.to(dtype), g.to(dtype), Device::cpu());
    EXPECT_EQ(low.out.dtype(), dtype);
    expect_close(low, ref, tol, dtype_name(dtype));
  }
}

TEST(CausalAttention, OutputAtPositionIgnoresLaterPositions) {
  Generator gen(14);
  const int64_t t = 12, cut = 5;
  Tensor q = randn({2, 2, t, 8}, gen, kF64), k = randn({2, 2, t, 8}, gen, kF64), v = randn({2, 2, t, 8}, gen, kF64);
  // Change q, k and v at positions after `cut` only.
  std::vector<double> later(static_cast<size_t>(t), 0.0);
  for (int64_t i = cut + 1; i < t; ++i) later[static_cast<size_t>(i)] = 1.0;
  Tensor mask = from_vector(later, {t, 1}, kF64);
  Tensor q2 = q + mask * randn(q.shape(), gen, kF64), k2 = k + mask * randn(k.shape(), gen, kF64);
  Tensor v2 = v + mask * randn(v.shape(), gen, kF64);
  auto a = causal_attention(q, k, v, 0.3).to_vector<double>();
  auto b = causal_attention(q2, k2, v2, 0.3).to_vector<double>();
  int changed = 0;
  for (int64_t h = 0; h < 4; ++h) {
    for (int64_t i = 0; i < t; ++i) {
      for (int64_t c = 0; c < 8; ++c) {
        const size_t at = static_cast<size_t>((h * t + i) * 8 + c);
        if (i <= cut) {
          EXPECT_EQ(a[at], b[at]) << "head " << h << " position " << i;
        } else {
          changed += a[at] != b[at];
        }
      }
    }
  }
  EXPECT_GT(changed, 0) << "later positions should see the change";
}

TEST(CausalAttention, RejectsMismatchedShapes) {
  Generator gen(15);
  Tensor q = randn({1, 2, 4, 8}, gen), k = randn({1, 2, 5, 8}, gen);
  EXPECT_THROW(causal_attention(q, k, k, 1.0), Error);
}

TEST(CudaFlashAttention, MatchesCpuForwardAndGradients) {
  if (!cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  for (int64_t d : {64, 32, 128}) {
    for (int64_t t : {1, 17, 64, 256, 1000}) {
      if (d == 128 && t > 256) continue;  // D = 128 shares the code path; keep the CPU reference quick
      // bfloat16: the mma kernels; float32 and float16: the composed path.
      for (DType dtype : {DType::BFloat16, DType::Float32, DType::Float16}) {
        Generator gen(100 + t + d);
        TensorOptions opts = TensorOptions{}.with_dtype(dtype);
        const int64_t b = 1, h = 2;
        Tensor q = randn({b, h, t, d}, gen, opts), k = randn({b, h, t, d}, gen, opts);
        Tensor v = randn({b, h, t, d}, gen, opts), g = randn({b, h, t, d}, gen, opts);
        const double scale = 1.0 / std::sqrt(static_cast<double>(d));
        auto attention = [&](auto x, auto y, auto z) { return causal_attention(x, y, z, scale); };
        Outcome cpu = run(attention, q, k, v, g, Device::cpu());
        Outcome gpu = run(attention, q, k, v, g, Device::cuda(0));
        const double tol = dtype == DType::Float32 ? 1e-4 : 2e-2;
        expect_close(gpu, cpu, tol, "T=" + std::to_string(t) + " D=" + std::to_string(d) + " " + dtype_name(dtype),
                     1.0);
      }
    }
  }
}

// bfloat16 on the mma.sync kernels (DPT_ATTENTION=auto and =flash: causal_attention has no cuDNN path)
// and on the composed path (DPT_ATTENTION=reference): each must agree with the CPU, so a failure points
// at one path.
TEST(CudaFlashAttention, MmaAndReferencePathsBothMatchCpuInBfloat16) {
  if (!cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  Generator gen(21);
  TensorOptions opts = TensorOptions{}.with_dtype(DType::BFloat16);
  Tensor q = randn({2, 3, 200, 64}, gen, opts), k = randn({2, 3, 200, 64}, gen, opts);
  Tensor v = randn({2, 3, 200, 64}, gen, opts), g = randn({2, 3, 200, 64}, gen, opts);
  auto attention = [](auto x, auto y, auto z) { return causal_attention(x, y, z, 0.125); };
  Outcome cpu = run(attention, q, k, v, g, Device::cpu());
  expect_close(run(attention, q, k, v, g, Device::cuda(0)), cpu, 2e-2, "default (mma)", 1.0);
  for (const char* path : {"flash", "reference"}) {
    ScopedFlag flag(Flag::Attention, path);
    expect_close(run(attention, q, k, v, g, Device::cuda(0)), cpu, 2e-2, path, 1.0);
  }
}

// The mma and the composed paths are two different computations: the reference path must not be the mma
// kernels under another name. The composed bfloat16 path rounds the [T, T] scores and probabilities to
// bfloat16, so the two differ in the low bits somewhere, while each is within 2e-2 of the CPU (above).
TEST(CudaFlashAttention, ReferenceFlagTakesTheComposedPath) {
  if (!cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  Generator gen(22);
  TensorOptions opts = TensorOptions{}.with_dtype(DType::BFloat16);
  Tensor q = randn({1, 2, 130, 64}, gen, opts), k = randn({1, 2, 130, 64}, gen, opts);
  Tensor v = randn({1, 2, 130, 64}, gen, opts), g = randn({1, 2, 130, 64}, gen, opts);
  auto attention = [](auto x, auto y, auto z) { return causal_attention(x, y, z, 0.125); };
  Outcome mma = run(attention, q, k, v, g, Device::cuda(0));
  ScopedFlag flag(Flag::Attention, "reference");
  Outcome composed = run(attention, q, k, v, g, Device::cuda(0));
  Outcome by_hand =
      run([](auto x, auto y, auto z) { return composed_attention(x, y, z, 0.125); }, q, k, v, g, Device::cuda(0));
  EXPECT_FALSE(mma.out.to_vector<double>() == composed.out.to_vector<double>());
  EXPECT_TRUE(by_hand.out.to_vector<double>() == composed.out.to_vector<double>());
  EXPECT_TRUE(by_hand.gq.to_vector<double>() == composed.gq.to_vector<double>());
}

// The mma.sync kernels at lengths around the tile boundaries (64-key tiles, 16-row warp blocks, 64-row
// blocks), T = 1, and every head size.
TEST(CudaFlashAttention, MmaKernelsMatchCpuAtTileBoundariesInBfloat16) {
  if (!cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  TensorOptions opts = TensorOptions{}.with_dtype(DType::BFloat16);
  for (int64_t d : {64, 32, 128}) {
    for (int64_t t : {1, 2, 15, 16, 17, 63, 65, 127, 128, 129, 191, 300}) {
      if (d != 64 && t > 129) continue;
      Generator gen(300 + t + d);
      Tensor q = randn({1, 3, t, d}, gen, opts), k = randn({1, 3, t, d}, gen, opts);
      Tensor v = randn({1, 3, t, d}, gen, opts), g = randn({1, 3, t, d}, gen, opts);
      const double scale = 1.0 / std::sqrt(static_cast<double>(d));
      auto attention = [&](auto x, auto y, auto z) { return causal_attention(x, y, z, scale); };
      expect_close(run(attention, q, k, v, g, Device::cuda(0)), run(attention, q, k, v, g, Device::cpu()), 2e-2,
                   "T=" + std::to_string(t) + " D=" + std::to_string(d), 1.0);
    }
  }
}

// The mma kernels fold a positive scale into the exponent; a negative scale (no attention layer uses
// one, but the op allows it) takes the composed path and must still match the CPU.
TEST(CudaFlashAttention, NegativeScaleMatchesCpuInBfloat16) {
  if (!cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  Generator gen(24);
  TensorOptions opts = TensorOptions{}.with_dtype(DType::BFloat16);
  Tensor q = randn({1, 2, 70, 64}, gen, opts), k = randn({1, 2, 70, 64}, gen, opts);
  Tensor v = randn({1, 2, 70, 64}, gen, opts), g = randn({1, 2, 70, 64}, gen, opts);
  auto attention = [](auto x, auto y, auto z) { return causal_attention(x, y, z, -0.2); };
  expect_close(run(attention, q, k, v, g, Device::cuda(0)), run(attention, q, k, v, g, Device::cpu()), 2e-2,
               "scale -0.2", 1.0);
}

// Large scores (scale 1: logits of size ~ sqrt(D)) stress the online softmax rescaling: the running
// maximum changes from tile to tile and most probabilities underflow.
TEST(CudaFlashAttention, MmaKernelsHandleLargeScores) {
  if (!cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  Generator gen(23);
  TensorOptions opts = TensorOptions{}.with_dtype(DType::BFloat16);
  Tensor q = randn({1, 2, 333, 64}, gen, opts), k = randn({1, 2, 333, 64}, gen, opts);
  Tensor v = randn({1, 2, 333, 64}, gen, opts), g = randn({1, 2, 333, 64}, gen, opts);
  auto attention = [](auto x, auto y, auto z) { return causal_attention(x, y, z, 1.0); };
  expect_close(run(attention, q, k, v, g, Device::cuda(0)), run(attention, q, k, v, g, Device::cpu()), 3e-2, "scale 1",
               1.0);
}

// Permuted float32 views: the composed path on CUDA, against the CPU kernels.
TEST(CudaFlashAttention, StridedInputsMatchCpu) {
  if (!cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  Generator gen(16);
  Tensor q = randn({2, 70, 3, 64}, gen).permute({0, 2, 1, 3}), k = randn({2, 70, 3, 64}, gen).permute({0, 2, 1, 3});
  Tensor v = randn({2, 70, 3, 64}, gen).permute({0, 2, 1, 3}), g = randn({2, 3, 70, 64}, gen);
  auto attention = [](auto x, auto y, auto z) { return causal_attention(x, y, z, 0.125); };
  expect_close(run(attention, q, k, v, g, Device::cuda(0)), run(attention, q, k, v, g, Device::cpu()), 1e-4,
               "strided float32");
}

TEST(CudaFlashAttention, BackwardIsBitwiseDeterministic) {
  if (!cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  Generator gen(17);
  TensorOptions opts = TensorOptions{}.with_dtype(DType::BFloat16);
  Tensor q = randn({2, 4, 300, 64}, gen, opts), k = randn({2, 4, 300, 64}, gen, opts);
  Tensor v = randn({2, 4, 300, 64}, gen, opts), g = randn({2, 4, 300, 64}, gen, opts);
  auto attention = [](auto x, auto y, auto z) { return causal_attention(x, y, z, 0.125); };
  Outcome a = run(attention, q, k, v, g, Device::cuda(0)), b = run(attention, q, k, v, g, Device::cuda(0));
  EXPECT_EQ(a.out.to_vector<double>(), b.out.to_vector<double>());
  EXPECT_EQ(a.gq.to_vector<double>(), b.gq.to_vector<double>());
  EXPECT_EQ(a.gk.to_vector<double>(), b.gk.to_vector<double>());
  EXPECT_EQ(a.gv.to_vector<double>(), b.gv.to_vector<double>());
}

// Every case without mma kernels: float32, float16 and float64, and bfloat16 with a head size they are not
// built for.
TEST(CudaFlashAttention, UnsupportedHeadSizeAndDtypesTakeTheComposedPath) {
  if (!cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  for (auto [dtype, d] : {std::pair{DType::Float32, int64_t{48}}, std::pair{DType::Float32, int64_t{64}},
                          std::pair{DType::Float16, int64_t{64}}, std::pair{DType::Float64, int64_t{64}},
                          std::pair{DType::BFloat16, int64_t{48}}}) {
    EXPECT_FALSE(fused_causal_attention_supported(dtype, d));
    Generator gen(18);
    TensorOptions opts = TensorOptions{}.with_dtype(dtype);
    Tensor q = randn({1, 2, 40, d}, gen, opts), k = randn({1, 2, 40, d}, gen, opts);
    Tensor v = randn({1, 2, 40, d}, gen, opts), g = randn({1, 2, 40, d}, gen, opts);
    auto attention = [](auto x, auto y, auto z) { return causal_attention(x, y, z, 0.2); };
    // The 16-bit types round the composed path's scores and probabilities: their usual 2e-2.
    const bool wide = dtype == DType::Float32 || dtype == DType::Float64;
    expect_close(run(attention, q, k, v, g, Device::cuda(0)), run(attention, q, k, v, g, Device::cpu()),
                 wide ? 1e-4 : 2e-2, dtype_name(dtype) + std::string(" D=") + std::to_string(d), wide ? 1e-30 : 1.0);
  }
}

// GPT-2 124M's attention shape (B = 2 of 16, all 12 heads, T = 1024, D = 64) in bfloat16, against the
// composed path on the GPU run in float32 on the same bfloat16 values (the composed bfloat16 path
// rounds the [T, T] scores and probabilities to bfloat16 and would be the less accurate side).
TEST(CudaFlashAttention, Gpt2SizedBfloat16MatchesComposedPathOnGpu) {
  if (!cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  Generator gen(19);
  TensorOptions opts = TensorOptions{}.with_dtype(DType::BFloat16);
  const Shape shape{2, 12, 1024, 64};
  Tensor q = randn(shape, gen, opts), k = randn(shape, gen, opts), v = randn(shape, gen, opts);
  Tensor g = randn(shape, gen, opts);
  const Device gpu = Device::cuda(0);
  Outcome fused = run([](auto x, auto y, auto z) { return causal_attention(x, y, z, 0.125); }, q, k, v, g, gpu);
  auto f32 = [](const Tensor& x) { return x.to(DType::Float32); };
  Outcome ref = run([](auto x, auto y, auto z) { return composed_attention(x, y, z, 0.125); }, f32(q), f32(k), f32(v),
                    f32(g), gpu);
  expect_close(fused, ref, 2e-2, "GPT-2 sized bfloat16");
  // And the composed bfloat16 path itself, which the fused op replaces in training, is no closer.
  Outcome composed_bf16 =
      run([](auto x, auto y, auto z) { return composed_attention(x, y, z, 0.125); }, q, k, v, g, gpu);
  EXPECT_LT(max_relative(fused.out, ref.out), max_relative(composed_bf16.out, ref.out) + 1e-2);
}
