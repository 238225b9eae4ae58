// The column-sum handoff (core/grad_column_sums.h): a linear's bias gradient handed over by the consumer
// whose backward wrote the output's gradient (flash attention on a packed QKV projection). Pinned here:
// the handshake itself (only the offering op's own output is claimed, once; sums are taken only for the
// very tensor delivered); the attention kernels' sums against float64 sums of the gradient they wrote, on
// the CPU and on CUDA; and on CUDA, forward/backward passes with the handoff on and off: every gradient but
// the bias is bitwise the same, the bias within the rounding of a reordered sum, and a second consumer of
// the projection's output makes the linear sum its columns itself.
#include "core/grad_column_sums.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "core/attention_layout.h"
#include "core/cuda_runtime.h"
#include "core/error.h"
#include "core/factory.h"
#include "core/flags.h"
#include "core/flash_attention_kernels.h"
#include "core/kernel_dispatch.h"
#include "core/ops.h"
#include "core/ops_flash_attention.h"
#include "linear_switches.h"
#include "max_relative.h"

using namespace dpt;

namespace {

const TensorOptions kF64 = TensorOptions{}.with_dtype(DType::Float64);

// Column sums of a [rows, n] tensor in float64 on the CPU: the reference for every kernel below.
Tensor column_sums_f64(const Tensor& g, int64_t n) {
  return sum(g.to(Device::cpu()).to(DType::Float64).reshape({g.numel() / n, n}), 0);
}

TEST(GradColumnSums, SumsAreTakenOnlyForTheDeliveredTensorAndOnlyOnce) {
  GradColumnSums h(3, DType::Float64);
  Tensor g = ones({2, 3}, kF64), other = ones({2, 3}, kF64), s = full({3}, 2.0, kF64);
  h.deliver(g, s);
  EXPECT_FALSE(h.take(other).defined());  // another tensor, even with the same values
  EXPECT_FALSE(h.take(g).defined());      // and the failed take emptied the handoff
  h.deliver(g, s);
  Tensor got = h.take(g.reshape({2, 3}));  // a view is another tensor
  EXPECT_FALSE(got.defined());
  h.deliver(g, s);
  EXPECT_EQ(h.take(g).to_vector<double>(), s.to_vector<double>());
  EXPECT_FALSE(h.take(g).defined());
  EXPECT_THROW(h.deliver(g, ones({4}, kF64)), Error);  // sums of the wrong width
}

TEST(GradColumnSums, OnlyTheOfferingOpsOwnOutputIsClaimedAndOnlyOnce) {
  ColumnSumsSwitch on(true);
  Tensor x = ones({2, 3}, kF64).requires_grad_();
  Tensor y = mul(x, 2.0);
  auto offer = std::make_shared<GradColumnSums>(3, DType::Float64);
  offer_grad_column_sums(y, offer);
  EXPECT_EQ(claim_grad_column_sums(y.reshape({3, 2})), nullptr);  // a view of the output
  EXPECT_EQ(claim_grad_column_sums(x), nullptr);                  // a leaf that offers nothing
  EXPECT_EQ(claim_grad_column_sums(y), offer);
  EXPECT_EQ(claim_grad_column_sums(y), nullptr);  // already claimed
  ColumnSumsSwitch off(false);
  Tensor z = mul(x, 3.0);
  offer_grad_column_sums(z, std::make_shared<GradColumnSums>(3, DType::Float64));
  EXPECT_EQ(claim_grad_column_sums(z), nullptr);
}

// The packed attention backward's grad_sums against float64 sums of the gradient it wrote. T = 200 is no
// multiple of the 64-row tiles; D = 32, 64 and 128 are the mma kernels' head sizes.
void check_attention_sums(Device device, DType dtype, DType sums_dtype, double tolerance) {
  const int64_t b = 2, t = 200, h = 3;
  for (int64_t d : {64, 32, 128}) {
    Generator gen(60 + d);
    const TensorOptions o = TensorOptions{}.with_dtype(dtype).with_device(device);
    const int64_t c = h * d, bh = b * h;
    const double scale = 1.0 / std::sqrt(static_cast<double>(d));
    const AttentionLayouts lay = AttentionLayouts::packed_qkv(h, t, d);
    Tensor qkv = randn({b, t, 3 * c}, gen, o), gout = randn({b, t, c}, gen, o);
    Tensor out = Tensor::empty({b, t, c}, o), grad = Tensor::empty(qkv.shape(), o);
    Tensor lse = Tensor::empty({b, h, t}, o.with_dtype(dtype == DType::Float64 ? DType::Float64 : DType::Float32));
    Tensor sums = Tensor::empty({3 * c}, o.with_dtype(sums_dtype));
    DPT_KERNEL_DISPATCH(device, flash_attention_forward_strided, qkv, qkv, qkv, out, lse, lay, bh, t, d, scale);
    DPT_KERNEL_DISPATCH(device, flash_attention_backward_strided, qkv, qkv, qkv, out, gout, lse, grad, grad, grad, lay,
                        bh, t, d, scale, sums);
    EXPECT_LT(max_relative(sums.to(Device::cpu()), column_sums_f64(grad, 3 * c)), tolerance)
        << device.str() << " d=" << d << " sums " << dtype_name(sums_dtype);
  }
}

TEST(GradColumnSums, PackedAttentionBackwardSumsTheGradientItWritesOnCpu) {
  check_attention_sums(Device::cpu(), DType::Float64, DType::Float64, 1e-12);
}

TEST(CudaGradColumnSums, PackedAttentionBackwardSumsTheGradientItWrites) {
  if (!cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  check_attention_sums(Device::cuda(0), DType::BFloat16, DType::Float32, 1e-5);
  check_attention_sums(Device::cuda(0), DType::BFloat16, DType::BFloat16, 1e-2);
}

// One forward/backward of `net` from fixed leaves; the gradients of (x, weight, bias) on the CPU.
struct LinearGrads {
  Tensor x, w, b;
};

template <class Net>
LinearGrads grads_of(Net&& net, const Tensor& x0, const Tensor& w0, const Tensor& b0, bool handoff) {
  ColumnSumsSwitch s(handoff);
  ScopedFlag ours(Flag::Attention, "flash");  // the handoff's claimant is our attention backward; cuDNN's sums nothing
  Tensor x = x0.detach().clone().requires_grad_(), w = w0.detach().clone().requires_grad_();
  Tensor b = b0.detach().clone().requires_grad_();
  net(x, w, b).backward();
  auto host = [](const Tensor& g) { return g.to(Device::cpu()).to(DType::Float64); };
  return {host(x.grad()), host(w.grad()), host(b.grad())};
}

// With and without the handoff: x and weight gradients bitwise the same (the handoff touches only the
// bias), the bias within `tolerance` (another summation order, one rounding).
template <class Net>
void expect_handoff_changes_only_the_bias_order(Net&& net, int64_t k, int64_t n, DType dtype, double tolerance,
                                                const std::string& what) {
  Generator gen(21);
  const TensorOptions o = TensorOptions{}.with_dtype(dtype).with_device(Device::cuda(0));
  Tensor x = randn({4, 96, k}, gen, o), w = mul(randn({n, k}, gen, o), 0.1), b = randn({n}, gen, o);
  LinearGrads on = grads_of(net, x, w, b, true), off = grads_of(net, x, w, b, false);
  EXPECT_TRUE(on.x.to_vector<double>() == off.x.to_vector<double>()) << what;
  EXPECT_TRUE(on.w.to_vector<double>() == off.w.to_vector<double>()) << what;
  EXPECT_LT(max_relative(on.b, off.b), tolerance) << what;
}

TEST(CudaGradColumnSums, QkvBiasGradientWithTheHandoffEqualsTheLinearsOwnSums) {
  if (!cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const int64_t c = 128, heads = 2;
  for (DType dtype : {DType::Float32, DType::BFloat16}) {  // float32 attention runs the composition
    Generator gen(22);
    const TensorOptions o = TensorOptions{}.with_dtype(dtype).with_device(Device::cuda(0));
    Tensor v = randn({4, 96, c}, gen, o);
    expect_handoff_changes_only_the_bias_order(
        [&](const Tensor& x, const Tensor& w, const Tensor& b) {
          return sum(mul(causal_attention_qkv(linear(x, w, b), heads, 0.125), v));
        },
        c, 3 * c, dtype, dtype == DType::Float32 ? 1e-5 : 1e-2, std::string("QKV projection ") + dtype_name(dtype));
  }
}

// The projection's output also reaches the loss directly: the gradient the linear receives is the sum
// of two paths, not what attention delivered, so it must sum its columns itself, exactly as without the
// handoff (bitwise the same bias gradient).
TEST(CudaGradColumnSums, ASecondConsumerMakesTheLinearSumItsOwnColumns) {
  if (!cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const int64_t c = 128, heads = 2;
  Generator gen(23);
  const TensorOptions o = TensorOptions{}.with_dtype(DType::BFloat16).with_device(Device::cuda(0));
  Tensor v = randn({4, 96, c}, gen, o);
  auto net = [&](const Tensor& x, const Tensor& w, const Tensor& b) {
    Tensor y = linear(x, w, b);
    return add(sum(mul(causal_attention_qkv(y, heads, 0.125), v)), sum(mul(y, y)));
  };
  Tensor x = randn({4, 96, c}, gen, o), w = mul(randn({3 * c, c}, gen, o), 0.1), b = randn({3 * c}, gen, o);
  LinearGrads on = grads_of(net, x, w, b, true), off = grads_of(net, x, w, b, false);
  EXPECT_TRUE(on.b.to_vector<double>() == off.b.to_vector<double>());
  EXPECT_TRUE(on.w.to_vector<double>() == off.w.to_vector<double>());
}

}  // namespace
