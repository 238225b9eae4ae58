// causal_attention_qkv (core/ops_flash_attention.h) on a packed [B, T, 3C] projection: it must equal the
// composition it replaces (split -> heads [B, H, T, D] -> causal_attention -> heads merged), forward and
// gradient. On the CPU the reference kernels run through the same layouts, so the two agree exactly; on
// CUDA (bfloat16) the mma kernels read and write the packed tensors in place and do the same arithmetic
// in the same order as on contiguous copies, so the results are bitwise those of the old path.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "core/cuda_runtime.h"
#include "core/error.h"
#include "core/factory.h"
#include "core/flags.h"
#include "core/ops.h"
#include "core/ops_flash_attention.h"
#include "gradcheck.h"
#include "max_relative.h"

using namespace dpt;

namespace {

// What layers/attention.cpp did before causal_attention_qkv: split, heads, causal_attention (which
// copies each head view contiguous), heads merged back. Stated here rather than taken from
// core/ops_flash_attention.cpp (whose fallback is the same composition), so the reference does not come
// from the code under test.
Tensor composed_qkv(const Tensor& qkv, int64_t n_head, double scale) {
  const int64_t b = qkv.size(0), t = qkv.size(1), c = qkv.size(2) / 3, d = c / n_head;
  std::vector<Tensor> parts = split(qkv, {c, c, c}, 2);
  auto heads = [&](const Tensor& p) { return p.reshape({b, t, n_head, d}).permute({0, 2, 1, 3}); };
  Tensor y = causal_attention(heads(parts[0]), heads(parts[1]), heads(parts[2]), scale);
  return y.permute({0, 2, 1, 3}).reshape({b, t, c});
}

struct Outcome {
  Tensor out, grad;  // on the CPU
};

// Output and gradient of sum(out * g) for a fresh leaf made from qkv on `device`.
template <class F>
Outcome run(F&& attention, const Tensor& qkv, const Tensor& g, Device device) {
  Tensor leaf = qkv.to(device).detach().clone().requires_grad_();
  Tensor out = attention(leaf);
  out.backward(g.to(device));
  return {out.to(Device::cpu()), leaf.grad().to(Device::cpu())};
}

// Bitwise for float32, bfloat16 and float64 values: their conversion to double is exact (a -0.0 and a
// +0.0 compare equal, and no NaN appears in these tests).
void expect_identical(const Outcome& got, const Outcome& want, const std::string& what) {
  EXPECT_EQ(got.out.shape(), want.out.shape()) << what;
  EXPECT_EQ(got.grad.shape(), want.grad.shape()) << what;
  EXPECT_TRUE(got.out.to_vector<double>() == want.out.to_vector<double>()) << "output " << what;
  EXPECT_TRUE(got.grad.to_vector<double>() == want.grad.to_vector<double>()) << "qkv gradient " << what;
}

std::string shape_name(int64_t b, int64_t t, int64_t h, int64_t d) {
  return "B=" + std::to_string(b) + " T=" + std::to_string(t) + " H=" + std::to_string(h) + " D=" + std::to_string(d);
}

}  // namespace

TEST(CausalAttentionQkv, EqualsSplitHeadsCompositionOnCpuInFloat32AndFloat64) {
  struct Case {
    int64_t b, t, h, d;
  };
  for (const Case& s : {Case{2, 9, 3, 8}, Case{3, 70, 2, 16}, Case{1, 1, 1, 4}}) {
    for (DType dtype : {DType::Float64, DType::Float32}) {
      Generator gen(40 + s.t);
      TensorOptions opts = TensorOptions{}.with_dtype(dtype);
      const int64_t c = s.h * s.d;
      Tensor qkv = randn({s.b, s.t, 3 * c}, gen, opts), g = randn({s.b, s.t, c}, gen, opts);
      const double scale = 1.0 / std::sqrt(static_cast<double>(s.d));
      Outcome packed = run([&](const Tensor& x) { return causal_attention_qkv(x, s.h, scale); }, qkv, g, Device::cpu());
      Outcome composed = run([&](const Tensor& x) { return composed_qkv(x, s.h, scale); }, qkv, g, Device::cpu());
      EXPECT_EQ(packed.out.shape(), (Shape{s.b, s.t, c}));
      expect_identical(packed, composed, shape_name(s.b, s.t, s.h, s.d) + " " + dtype_name(dtype));
    }
  }
}

TEST(CausalAttentionQkv, NonContiguousQkvEqualsCompositionOnCpu) {
  Generator gen(45);
  TensorOptions opts = TensorOptions{}.with_dtype(DType::Float64);
  // [T, B, 3C] permuted to [B, T, 3C]: the op makes it contiguous first; the gradient keeps the input's shape.
  Tensor qkv = randn({13, 2, 3 * 12}, gen, opts).permute({1, 0, 2}), g = randn({2, 13, 12}, gen, opts);
  Outcome packed = run([](const Tensor& x) { return causal_attention_qkv(x, 3, 0.4); }, qkv, g, Device::cpu());
  Outcome composed = run([](const Tensor& x) { return composed_qkv(x, 3, 0.4); }, qkv, g, Device::cpu());
  expect_identical(packed, composed, "permuted float64");
}

TEST(CausalAttentionQkv, GradientMatchesFiniteDifferencesInFloat64) {
  Generator gen(41);
  Tensor qkv = randn({2, 5, 3 * 2 * 4}, gen, TensorOptions{}.with_dtype(DType::Float64));  // B 2, T 5, H 2, D 4
  expect_gradients_match([](const std::vector<Tensor>& in) { return causal_attention_qkv(in[0], 2, 0.6); }, {qkv},
                         1e-6);
}

TEST(CausalAttentionQkv, RejectsALastDimensionThatIsNotThreeTimesAHeadMultiple) {
  Generator gen(42);
  try {
    causal_attention_qkv(randn({2, 5, 20}, gen), 3, 0.5);  // 20 is not a multiple of 3 * 3
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("[2, 5, 20]"), std::string::npos) << e.what();
  }
}

TEST(CausalAttentionQkv, RejectsQkvThatIsNotThreeDimensional) {
  Generator gen(43);
  try {
    causal_attention_qkv(randn({5, 24}, gen), 2, 0.5);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("[5, 24]"), std::string::npos) << e.what();
  }
  EXPECT_THROW(causal_attention_qkv(randn({1, 4, 24}, gen), 0, 0.5), Error);
}

// The tentpole: bfloat16 on the mma kernels, reading q, k, v in place from [B, T, 3C] and writing out
// [B, T, C] and the [B, T, 3C] gradient directly, gives the bits of the old path (contiguous copies of
// every head view, the same kernels, copies back), for every head size; T = 200 is no multiple of the
// 64-row tiles. And both are close to float64 on the CPU.
TEST(CudaFlashAttentionQkv, PackedMmaPathIsBitwiseTheContiguousPathInBfloat16) {
  if (!cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  ScopedFlag mma_forward(Flag::Attention, "flash");  // the packed path's forward on our kernels, as the old path's
  const int64_t b = 2, t = 200, h = 3;
  for (int64_t d : {64, 32, 128}) {
    Generator gen(50 + d);
    TensorOptions opts = TensorOptions{}.with_dtype(DType::BFloat16);
    const int64_t c = h * d;
    Tensor qkv = randn({b, t, 3 * c}, gen, opts), g = randn({b, t, c}, gen, opts);
    const double scale = 1.0 / std::sqrt(static_cast<double>(d));
    const Device gpu = Device::cuda(0);
    const std::string what = shape_name(b, t, h, d);
    Outcome packed = run([&](const Tensor& x) { return causal_attention_qkv(x, h, scale); }, qkv, g, gpu);
    Outcome composed = run([&](const Tensor& x) { return composed_qkv(x, h, scale); }, qkv, g, gpu);
    expect_identical(packed, composed, what);
    auto f64 = [](const Tensor& x) { return x.to(DType::Float64); };
    Outcome ref =
        run([&](const Tensor& x) { return causal_attention_qkv(x, h, scale); }, f64(qkv), f64(g), Device::cpu());
    EXPECT_LT(max_relative(packed.out, ref.out, 1.0), 2e-2) << "output vs float64 " << what;
    EXPECT_LT(max_relative(packed.grad, ref.grad, 1.0), 2e-2) << "qkv gradient vs float64 " << what;
  }
}

// Cases the strided kernels do not take run the composition itself, so they equal it bit for bit:
// DPT_ATTENTION=reference, float32, float16, a head size without mma kernels (D = 48), and a packed
// tensor whose rows are not 16-byte aligned (a view one element into its buffer).
TEST(CudaFlashAttentionQkv, UnsupportedCasesRunTheCompositionOnCuda) {
  if (!cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const Device gpu = Device::cuda(0);
  const int64_t b = 2, t = 70, h = 2;
  auto check = [&](DType dtype, int64_t d, bool misaligned, const std::string& what) {
    Generator gen(60 + d);
    TensorOptions opts = TensorOptions{}.with_dtype(dtype);
    const int64_t c = h * d, n = b * t * 3 * c;
    Tensor qkv = randn({b, t, 3 * c}, gen, opts), g = randn({b, t, c}, gen, opts);
    auto packed_fn = [&](const Tensor& x) {
      if (!misaligned) return causal_attention_qkv(x, h, 0.125);
      // The same values one element into a larger buffer: a contiguous view whose rows start 2 bytes
      // past a 16-byte boundary. Its gradient flows back to x through the slice and reshape.
      Tensor buffer = concat({zeros({1}, x.options()), x.reshape({n})}, 0);
      return causal_attention_qkv(slice(buffer, 0, 1, n + 1).reshape({b, t, 3 * c}), h, 0.125);
    };
    Outcome packed = run(packed_fn, qkv, g, gpu);
    Outcome composed = run([&](const Tensor& x) { return composed_qkv(x, h, 0.125); }, qkv, g, gpu);
    expect_identical(packed, composed, what);
  };
  {
    ScopedFlag reference(Flag::Attention, "reference");
    check(DType::BFloat16, 64, false, "bfloat16 DPT_ATTENTION=reference");
  }
  check(DType::Float32, 64, false, "float32");
  check(DType::Float16, 64, false, "float16");
  check(DType::BFloat16, 48, false, "bfloat16 D=48");
  check(DType::BFloat16, 64, true, "bfloat16 misaligned");
}
