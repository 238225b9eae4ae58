// distributed/split_linear.h: a split linear's sink sees the layer's input rows in forward and the gradient
// of x W^T + b in backward, from which dW = dpre^T x and db = colsum(dpre) must equal what autograd forms
// through dpt::linear; W and b then receive no gradient, and dx is dpt::linear's. Two layers (ReLU between
// them), so that on CUDA the second layer's backward absorbs the first's activation and both sinks are
// reached from inside that one node. CPU in float64 (the composed path and its tap), CUDA in float32 and
// bfloat16 (the fused path), each against the same network through dpt::linear.
#include "distributed/split_linear.h"

#include <gtest/gtest.h>

#include <memory>
#include <tuple>
#include <vector>

#include "core/autograd.h"
#include "core/cuda_runtime.h"
#include "core/factory.h"
#include "core/max_relative.h"
#include "core/ops.h"
#include "layers/linear.h"

namespace dpt::dist {
namespace {

struct Recorder : LinearGradSink {
  std::vector<Tensor> inputs, output_grads;
  void on_input(const Tensor& x) override { inputs.push_back(x.clone()); }
  void on_output_grad(const Tensor& dpre) override { output_grads.push_back(dpre.clone()); }
};

struct Net {
  Tensor w1, b1, w2, b2;
  Net(const TensorOptions& opts, Generator& gen, bool bias_grads) {
    w1 = randn({16, 8}, gen, opts).requires_grad_(true);
    b1 = randn({16}, gen, opts).requires_grad_(bias_grads);
    w2 = randn({4, 16}, gen, opts).requires_grad_(true);
    b2 = randn({4}, gen, opts).requires_grad_(bias_grads);
  }
};

// A loss whose output gradient is not uniform: sum(y * c).
Tensor reference_loss(const Net& net, const Tensor& x, const Tensor& c) {
  return sum(mul(linear(linear(x, net.w1, net.b1, Activation::Relu), net.w2, net.b2), c));
}

// The reference's gradients against the recorders'. `dx_tol` 0 asks for dpt::linear's bits.
void check_split_gradients(const TensorOptions& opts, double tol, double dx_tol, bool bias_grads = true) {
  Generator gen(7);
  const Net reference(opts, gen, bias_grads);
  Generator same(7);
  const Net split(opts, same, bias_grads);
  Tensor x = randn({6, 8}, gen, opts), c = randn({6, 4}, gen, opts);
  Tensor x_ref = x.clone().requires_grad_(true), x_in = x.clone().requires_grad_(true);
  reference_loss(reference, x_ref, c).backward();

  auto r1 = std::make_shared<Recorder>(), r2 = std::make_shared<Recorder>();
  SplitLinear l1(split.w1, split.b1, r1), l2(split.w2, split.b2, r2);
  const Tensor h = l1.forward(x_in, Activation::Relu, {});
  sum(mul(l2.forward(h, Activation::None, {&l1, &l2}), c)).backward();

  ASSERT_EQ(r1->inputs.size(), 1u);
  ASSERT_EQ(r1->output_grads.size(), 1u);
  ASSERT_EQ(r2->inputs.size(), 1u);
  ASSERT_EQ(r2->output_grads.size(), 1u);
  EXPECT_FALSE(split.w1.grad().defined());
  EXPECT_FALSE(split.b1.grad().defined());
  EXPECT_FALSE(split.w2.grad().defined());
  EXPECT_FALSE(split.b2.grad().defined());
  EXPECT_LE(max_relative(r1->inputs[0], x), 0.0);
  EXPECT_LE(max_relative(x_in.grad(), x_ref.grad()), dx_tol);
  for (auto [r, w, b] :
       {std::make_tuple(r1, reference.w1, reference.b1), std::make_tuple(r2, reference.w2, reference.b2)}) {
    EXPECT_LE(max_relative(matmul(r->output_grads[0], r->inputs[0], true, false), w.grad()), tol);
    if (bias_grads) {
      EXPECT_LE(max_relative(sum(r->output_grads[0], 0), b.grad()), tol);
    }
  }
}

TEST(SplitLinear, CpuSinksFormTheGradientsAutogradWould) {
  check_split_gradients(TensorOptions{}.with_dtype(DType::Float64), 1e-12, 1e-12);
}

TEST(SplitLinear, CudaFusedPairReachesBothSinks) {
  if (cuda::device_count() < 1) GTEST_SKIP() << "needs a GPU";
  check_split_gradients(TensorOptions{}.with_device(Device::cuda(0)), 1e-5, 1e-5);
}

// With the biases frozen dpt::linear's pair runs the very GEMMs the split pair runs (the same epilogue, no
// bias gradient), so the input gradient must have its bits.
TEST(SplitLinear, CudaInputGradientHasDptLinearsBits) {
  if (cuda::device_count() < 1) GTEST_SKIP() << "needs a GPU";
  check_split_gradients(TensorOptions{}.with_device(Device::cuda(0)).with_dtype(DType::BFloat16), 2e-2, 0.0,
                        /*bias_grads=*/false);
}

// The first layer's input needs no gradient, so nothing upstream of the op requires grad but W: the sink
// must still be reached.
TEST(SplitLinear, ReachedWhenTheInputNeedsNoGradient) {
  Generator gen(3);
  const TensorOptions opts = TensorOptions{}.with_dtype(DType::Float64);
  Tensor w = randn({3, 5}, gen, opts).requires_grad_(true);
  Tensor x = randn({2, 5}, gen, opts);
  auto r = std::make_shared<Recorder>();
  SplitLinear op(w, Tensor(), r);
  sum(op.forward(x, Activation::None, {})).backward();
  ASSERT_EQ(r->output_grads.size(), 1u);
  EXPECT_LE(max_relative(r->output_grads[0], ones({2, 3}, opts)), 0.0);
  EXPECT_FALSE(w.grad().defined());
}

// A [batch, time, in] input reaches the sink as its [batch * time, in] rows, and the output gradient as
// [batch * time, out], so dW = dpre^T x holds whatever the leading dimensions.
TEST(SplitLinear, BatchedInputArrivesAsRows) {
  Generator gen(5);
  const TensorOptions opts = TensorOptions{}.with_dtype(DType::Float64);
  Tensor w = randn({3, 4}, gen, opts).requires_grad_(true);
  Tensor w_ref = w.detach().clone().requires_grad_(true);
  Tensor x = randn({2, 5, 4}, gen, opts), c = randn({2, 5, 3}, gen, opts);
  sum(mul(linear(x, w_ref, Tensor(), Activation::Gelu), c)).backward();
  auto r = std::make_shared<Recorder>();
  SplitLinear op(w, Tensor(), r);
  sum(mul(op.forward(x, Activation::Gelu, {}), c)).backward();
  ASSERT_EQ(r->inputs.size(), 1u);
  ASSERT_EQ(r->output_grads.size(), 1u);
  EXPECT_EQ(r->inputs[0].shape(), (Shape{10, 4}));
  EXPECT_EQ(r->output_grads[0].shape(), (Shape{10, 3}));
  EXPECT_LE(max_relative(matmul(r->output_grads[0], r->inputs[0], true, false), w_ref.grad()), 1e-12);
}

// nn::Linear runs the op installed on it for every form of its forward, and dpt::linear again once it is
// emptied.
TEST(SplitLinear, LinearLayerRunsTheInstalledOp) {
  Generator gen(11);
  nn::Linear layer(4, 3, true, gen);
  const Tensor x = randn({5, 4}, gen), residual = randn({5, 3}, gen);
  const Tensor plain = linear(x, layer.weight, layer.bias);
  std::vector<Activation> seen;
  layer.op = [&](const Tensor& in, Activation act) {
    seen.push_back(act);
    return linear(in, layer.weight, layer.bias, act) * 2.0;
  };
  EXPECT_LE(max_relative(layer.forward(x), plain * 2.0), 1e-6);
  EXPECT_LE(max_relative(layer.forward_with(x, Activation::Relu), relu(plain) * 2.0), 1e-6);
  EXPECT_LE(max_relative(layer.forward_residual(x, residual), add(residual, plain * 2.0)), 1e-6);
  EXPECT_EQ(seen, (std::vector<Activation>{Activation::None, Activation::Relu, Activation::None}));
  layer.op = nullptr;
  EXPECT_LE(max_relative(layer.forward(x), plain), 0.0);
}

}  // namespace
}  // namespace dpt::dist
