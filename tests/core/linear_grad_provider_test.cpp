// core/linear_grad_provider.h: a provider on W sees the layer's input rows in forward and the gradient of
// x W^T + b in backward, from which dW = dpre^T x and db = colsum(dpre) must equal what autograd forms
// without it; W and b then receive no gradient, and dx is unchanged. Two layers (ReLU between them), so
// that on CUDA the second layer's backward absorbs the first's activation (LinearPairBackward) and both
// providers are reached from inside that one node. CPU in float64 (the composed path and its tap), CUDA
// in float32 (the fused path), each against the same network without providers.
#include "core/linear_grad_provider.h"

#include <gtest/gtest.h>

#include <memory>
#include <tuple>
#include <vector>

#include "core/autograd.h"
#include "core/cuda_runtime.h"
#include "core/factory.h"
#include "core/ops.h"
#include "max_relative.h"

namespace dpt {
namespace {

struct Recorder : LinearGradProvider {
  std::vector<Tensor> inputs, output_grads;
  void on_input(const Tensor& x) override { inputs.push_back(x.clone()); }
  void on_output_grad(const Tensor& dpre) override { output_grads.push_back(dpre.clone()); }
};

struct Net {
  Tensor w1, b1, w2, b2;
  Net(const TensorOptions& opts, Generator& gen) {
    w1 = randn({16, 8}, gen, opts).requires_grad_(true);
    b1 = randn({16}, gen, opts).requires_grad_(true);
    w2 = randn({4, 16}, gen, opts).requires_grad_(true);
    b2 = randn({4}, gen, opts).requires_grad_(true);
  }
  // A loss whose output gradient is not uniform: sum(y * c).
  Tensor loss(const Tensor& x, const Tensor& c) const {
    Tensor h = linear(x, w1, b1, Activation::Relu);
    return sum(mul(linear(h, w2, b2), c));
  }
};

void check_provided_gradients(const TensorOptions& opts, double tol) {
  Generator gen(7);
  Net reference(opts, gen);
  Generator same(7);
  Net provided(opts, same);
  Tensor x = randn({6, 8}, gen, opts), c = randn({6, 4}, gen, opts);
  Tensor x_ref = x.clone().requires_grad_(true), x_in = x.clone().requires_grad_(true);
  reference.loss(x_ref, c).backward();

  auto r1 = std::make_shared<Recorder>(), r2 = std::make_shared<Recorder>();
  set_linear_grad_provider(provided.w1, r1);
  set_linear_grad_provider(provided.w2, r2);
  provided.loss(x_in, c).backward();
  set_linear_grad_provider(provided.w1, nullptr);
  set_linear_grad_provider(provided.w2, nullptr);

  ASSERT_EQ(r1->inputs.size(), 1u);
  ASSERT_EQ(r1->output_grads.size(), 1u);
  ASSERT_EQ(r2->inputs.size(), 1u);
  ASSERT_EQ(r2->output_grads.size(), 1u);
  EXPECT_FALSE(provided.w1.grad().defined());
  EXPECT_FALSE(provided.b1.grad().defined());
  EXPECT_FALSE(provided.w2.grad().defined());
  EXPECT_FALSE(provided.b2.grad().defined());
  EXPECT_LE(max_relative(r1->inputs[0], x), 0.0);
  EXPECT_LE(max_relative(x_in.grad(), x_ref.grad()), tol);
  for (auto [r, w, b] :
       {std::make_tuple(r1, reference.w1, reference.b1), std::make_tuple(r2, reference.w2, reference.b2)}) {
    Tensor dw = matmul(r->output_grads[0], r->inputs[0], true, false);
    Tensor db = sum(r->output_grads[0], 0);
    EXPECT_LE(max_relative(dw, w.grad()), tol);
    EXPECT_LE(max_relative(db, b.grad()), tol);
  }
}

TEST(LinearGradProvider, CpuProviderFormsTheGradientsAutogradWould) {
  check_provided_gradients(TensorOptions{}.with_dtype(DType::Float64), 1e-12);
}

TEST(LinearGradProvider, CudaFusedPathReachesBothProvidersOfAPair) {
  if (cuda::device_count() < 1) GTEST_SKIP() << "needs a GPU";
  check_provided_gradients(TensorOptions{}.with_device(Device::cuda(0)), 1e-5);
}

// The first layer's input needs no gradient, so nothing upstream of the tap requires grad but W: the
// provider must still be reached.
TEST(LinearGradProvider, ReachedWhenTheInputNeedsNoGradient) {
  Generator gen(3);
  const TensorOptions opts = TensorOptions{}.with_dtype(DType::Float64);
  Tensor w = randn({3, 5}, gen, opts).requires_grad_(true);
  Tensor x = randn({2, 5}, gen, opts);
  auto r = std::make_shared<Recorder>();
  set_linear_grad_provider(w, r);
  sum(linear(x, w, Tensor(), Activation::None)).backward();
  set_linear_grad_provider(w, nullptr);
  ASSERT_EQ(r->output_grads.size(), 1u);
  EXPECT_LE(max_relative(r->output_grads[0], ones({2, 3}, opts)), 0.0);
  EXPECT_FALSE(w.grad().defined());
}

// A [batch, time, in] input reaches the provider as its [batch * time, in] rows, and the output gradient
// as [batch * time, out], so dW = dpre^T x holds whatever the leading dimensions.
TEST(LinearGradProvider, BatchedInputArrivesAsRows) {
  Generator gen(5);
  const TensorOptions opts = TensorOptions{}.with_dtype(DType::Float64);
  Tensor w = randn({3, 4}, gen, opts).requires_grad_(true);
  Tensor w_ref = w.detach().clone().requires_grad_(true);
  Tensor x = randn({2, 5, 4}, gen, opts), c = randn({2, 5, 3}, gen, opts);
  sum(mul(linear(x, w_ref, Tensor(), Activation::Gelu), c)).backward();
  auto r = std::make_shared<Recorder>();
  set_linear_grad_provider(w, r);
  sum(mul(linear(x, w, Tensor(), Activation::Gelu), c)).backward();
  set_linear_grad_provider(w, nullptr);
  ASSERT_EQ(r->inputs.size(), 1u);
  ASSERT_EQ(r->output_grads.size(), 1u);
  EXPECT_EQ(r->inputs[0].shape(), (Shape{10, 4}));
  EXPECT_EQ(r->output_grads[0].shape(), (Shape{10, 3}));
  EXPECT_LE(max_relative(matmul(r->output_grads[0], r->inputs[0], true, false), w_ref.grad()), 1e-12);
}

// A provider that may still be writing W (gathered weights) finishes in before_read: every linear op, with
// gradients or without, and the residual form, must read W only after it. This one writes a pending value.
struct PendingWrite : LinearGradProvider {
  Tensor weight, pending;
  void on_input(const Tensor&) override {}
  void on_output_grad(const Tensor&) override {}
  void before_read() override {
    if (!pending.defined()) return;
    NoGradGuard no_grad;
    weight.copy_(pending);
    pending = Tensor();
  }
};

void check_reads_after_before_read(const TensorOptions& opts, double tol) {
  Generator gen(11);
  Tensor w = randn({3, 4}, gen, opts).requires_grad_(true), b = randn({3}, gen, opts);
  Tensor x = randn({5, 4}, gen, opts), residual = randn({5, 3}, gen, opts);
  auto writer = std::make_shared<PendingWrite>();
  writer->weight = w.detach();
  set_linear_grad_provider(w, writer);
  auto expect_reads = [&](const Tensor& got, const Tensor& written, const Tensor& plus, const char* what) {
    Tensor want = add(add(matmul(x, written, false, true), b), plus);
    EXPECT_LE(max_relative(got, want), tol) << what;
    EXPECT_FALSE(writer->pending.defined()) << what;
  };
  const Tensor none = zeros({5, 3}, opts);
  {
    writer->pending = randn({3, 4}, gen, opts);
    const Tensor written = writer->pending;
    expect_reads(linear(x, w, b, Activation::None), written, none, "with gradients");
  }
  {
    writer->pending = randn({3, 4}, gen, opts);
    const Tensor written = writer->pending;
    NoGradGuard no_grad;
    expect_reads(linear(x, w, b, Activation::None), written, none, "without gradients");
  }
  {
    writer->pending = randn({3, 4}, gen, opts);
    const Tensor written = writer->pending;
    expect_reads(linear_residual(x, w, b, residual), written, residual, "with a residual");
  }
  set_linear_grad_provider(w, nullptr);
}

TEST(LinearGradProvider, EveryLinearOpReadsTheWeightAfterBeforeReadOnCpu) {
  check_reads_after_before_read(TensorOptions{}.with_dtype(DType::Float64), 1e-12);
}

TEST(LinearGradProvider, EveryFusedLinearOpReadsTheWeightAfterBeforeReadOnCuda) {
  if (cuda::device_count() < 1) GTEST_SKIP() << "needs a GPU";
  check_reads_after_before_read(TensorOptions{}.with_device(Device::cuda(0)), 1e-5);
}

}  // namespace
}  // namespace dpt
