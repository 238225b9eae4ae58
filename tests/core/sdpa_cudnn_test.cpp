// cuDNN's fused attention for causal_attention_qkv (core/cuda/sdpa_cudnn.h): its forward must write the
// output and the logsumexp our own kernels write, and its backward the gradients of the reference, checked
// against the CPU reference in float64 on the packed layout GPT-2 uses; and the op must train the same
// with cuDNN (DPT_ATTENTION=auto) and without (flash: our kernels; reference: the composed path).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

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
// Dropout inside cuDNN's engines: the mask is cuDNN's own Philox draw, so it is read back rather than
// recomputed. With V the identity (T = D) the forward's output is the dropped weights r P M themselves
// (r = 1 / (1 - p)); P is known exactly in float64 from q and k, so M = out / (r P) must be 0 or 1, kept at
// the rate 1 - p, the same for the same seed and offset and another for another offset. Then the same
// draw on random values: the output and every gradient against float64 math with that mask.
TEST(CudnnAttention, DropoutKeepsOneMinusPOfTheWeightsAndItsBackwardUsesTheSameMask) {
  if (!cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const int64_t b = 2, t = 64, h = 2, d = 64, c = h * d, bh = b * h;
  const double scale = 0.125, p = 0.2, r = 1 / (1 - p);
  const AttentionLayouts layouts = AttentionLayouts::packed_qkv(h, t, d);
  const TensorOptions bf16 = TensorOptions{}.with_dtype(DType::BFloat16);
  Generator gen(93);
  Tensor qkv = randn({b, t, 3 * c}, gen, bf16), gout = randn({b, t, c}, gen, bf16);
  Tensor qkv_eye = qkv.to(DType::Float32);  // v := the identity in every head
  float* eye = static_cast<float*>(qkv_eye.data_ptr());
  for (int64_t i = 0; i < b * t; ++i) {
    for (int64_t col = 0; col < c; ++col) eye[i * 3 * c + 2 * c + col] = (i % t) == (col % d) ? 1.0f : 0.0f;
  }
  qkv_eye = qkv_eye.to(DType::BFloat16);
  struct Forward {
    Tensor out, lse;
  };
  auto forward = [&](const Tensor& x, uint64_t offset) {
    Tensor xg = x.to(Device::cuda(0));
    Forward f{zeros({b, t, c}, xg.options()), zeros({b, h, t}, xg.options().with_dtype(DType::Float32))};
    const AttentionDropout drop{static_cast<float>(p), PhiloxArgs{5, offset, nullptr}};
    EXPECT_TRUE(cuda_kernels::sdpa_forward_cudnn(xg, xg, xg, f.out, f.lse, layouts, bh, t, d, scale, drop));
    return f;
  };
  // Exact weights P[b, h, i, j] in float64 from the bf16 q and k.
  const std::vector<double> x = qkv.to_vector<double>();
  auto at = [&](int64_t bb, int64_t i, int64_t part, int64_t hh, int64_t e) {
    return x[(bb * t + i) * 3 * c + part * c + hh * d + e];
  };
  std::vector<double> weights(bh * t * t, 0.0);
  for (int64_t bb = 0; bb < b; ++bb) {
    for (int64_t hh = 0; hh < h; ++hh) {
      for (int64_t i = 0; i < t; ++i) {
        std::vector<double> s(i + 1);
        double top = -1e300, total = 0;
        for (int64_t j = 0; j <= i; ++j) {
          double dot = 0;
          for (int64_t e = 0; e < d; ++e) dot += at(bb, i, 0, hh, e) * at(bb, j, 1, hh, e);
          s[j] = scale * dot;
          top = std::max(top, s[j]);
        }
        for (int64_t j = 0; j <= i; ++j) total += s[j] = std::exp(s[j] - top);
        for (int64_t j = 0; j <= i; ++j) weights[((bb * h + hh) * t + i) * t + j] = s[j] / total;
      }
    }
  }
  // The mask read back: out[b, i, h D + j] = r P M for j <= i, zero above the diagonal.
  auto read_mask = [&](const Forward& f) {
    const std::vector<double> o = f.out.to(Device::cpu()).to_vector<double>();
    std::vector<int> mask(bh * t * t, 0);
    for (int64_t bb = 0; bb < b; ++bb) {
      for (int64_t hh = 0; hh < h; ++hh) {
        for (int64_t i = 0; i < t; ++i) {
          for (int64_t j = 0; j < t; ++j) {
            const double got = o[(bb * t + i) * c + hh * d + j], w = weights[((bb * h + hh) * t + i) * t + j];
            if (j > i) {
              EXPECT_EQ(got, 0.0) << "above the diagonal";
              continue;
            }
            const double m = got / (r * w);
            EXPECT_LT(std::min(std::abs(m), std::abs(m - 1)), 0.02) << "not a mask value: " << m;
            mask[((bb * h + hh) * t + i) * t + j] = m > 0.5;
          }
        }
      }
    }
    return mask;
  };
  const std::vector<int> mask = read_mask(forward(qkv_eye, 0));
  const int64_t drawn = bh * t * (t + 1) / 2;
  int64_t kept = 0, same_again = 0, same_elsewhere = 0;
  const std::vector<int> again = read_mask(forward(qkv_eye, 0)), elsewhere = read_mask(forward(qkv_eye, 1 << 20));
  for (int64_t bb = 0; bb < bh; ++bb) {
    for (int64_t i = 0; i < t; ++i) {
      for (int64_t j = 0; j <= i; ++j) {
        const int64_t k = (bb * t + i) * t + j;
        kept += mask[k];
        same_again += mask[k] == again[k];
        same_elsewhere += mask[k] == elsewhere[k];
      }
    }
  }
  // 8320 draws: the kept fraction's standard deviation is 0.0044, so +-0.025 is more than 5 of them.
  EXPECT_NEAR(static_cast<double>(kept) / drawn, 1 - p, 0.025);
  EXPECT_EQ(same_again, drawn) << "the same seed and offset must draw the same mask";
  EXPECT_LT(static_cast<double>(same_elsewhere) / drawn, 0.8) << "another offset must draw another mask";

  // The same draw on random values: out = (r P M) V; D = rowsum(dO out); dV = (r P M)^T dO;
  // dS = P (r M dO V^T - D); dQ = scale dS K; dK = scale dS^T Q.
  const Forward f = forward(qkv, 0);
  const std::vector<double> g = gout.to_vector<double>();
  std::vector<double> out(b * t * c, 0.0), grad(b * t * 3 * c, 0.0);
  for (int64_t bb = 0; bb < b; ++bb) {
    for (int64_t hh = 0; hh < h; ++hh) {
      auto w = [&](int64_t i, int64_t j) { return weights[((bb * h + hh) * t + i) * t + j]; };
      auto m = [&](int64_t i, int64_t j) { return mask[((bb * h + hh) * t + i) * t + j]; };
      auto go = [&](int64_t i, int64_t e) { return g[(bb * t + i) * c + hh * d + e]; };
      auto gq = [&](int64_t i, int64_t part, int64_t e) -> double& {
        return grad[(bb * t + i) * 3 * c + part * c + hh * d + e];
      };
      for (int64_t i = 0; i < t; ++i) {
        double dsum = 0;
        for (int64_t e = 0; e < d; ++e) {
          double o = 0;
          for (int64_t j = 0; j <= i; ++j) o += r * w(i, j) * m(i, j) * at(bb, j, 2, hh, e);
          out[(bb * t + i) * c + hh * d + e] = o;
          dsum += go(i, e) * o;
        }
        for (int64_t j = 0; j <= i; ++j) {
          double dp = 0;
          for (int64_t e = 0; e < d; ++e) {
            dp += go(i, e) * at(bb, j, 2, hh, e);
            gq(j, 2, e) += r * w(i, j) * m(i, j) * go(i, e);
          }
          const double ds = w(i, j) * (r * m(i, j) * dp - dsum);
          for (int64_t e = 0; e < d; ++e) {
            gq(i, 0, e) += scale * ds * at(bb, j, 1, hh, e);
            gq(j, 1, e) += scale * ds * at(bb, i, 0, hh, e);
          }
        }
      }
    }
  }
  const TensorOptions f64 = TensorOptions{}.with_dtype(DType::Float64);
  EXPECT_LT(max_relative(f.out.to(Device::cpu()), from_vector(out, {b, t, c}, f64), 1.0), 1e-2);
  Tensor xg = qkv.to(Device::cuda(0)), got = zeros({b, t, 3 * c}, xg.options());
  const AttentionDropout drop{static_cast<float>(p), PhiloxArgs{5, 0, nullptr}};
  ASSERT_TRUE(cuda_kernels::sdpa_backward_cudnn(xg, xg, xg, f.out, gout.to(Device::cuda(0)), f.lse, got, got, got,
                                                layouts, bh, t, d, scale, drop));
  EXPECT_LT(max_relative(got.to(Device::cpu()), from_vector(grad, {b, t, 3 * c}, f64), 1.0), 2e-2);
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
