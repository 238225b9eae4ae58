// The autograd engine: accumulation, no-grad scopes, in-place gradient buffers and grad-ready hooks.
#include "core/autograd.h"

#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>

#include "core/error.h"
#include "core/factory.h"
#include "core/ops.h"

namespace dpt {
namespace {

const TensorOptions kF64 = TensorOptions{}.with_dtype(DType::Float64);

Tensor leaf(std::vector<double> v, const Shape& shape) {
  Tensor t = from_vector(v, shape, kF64);
  t.requires_grad_(true);
  return t;
}

TEST(Autograd, GradientsAccumulateAcrossTwoBackwards) {
  Tensor x = leaf({1, 2}, {2});
  sum(mul(x, x)).backward();  // 2x
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{2, 4}));
  sum(mul(x, 3.0)).backward();  // + 3
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{5, 7}));
}

TEST(Autograd, LeafUsedTwiceReceivesTheSumOfBothPaths) {
  Tensor x = leaf({3}, {1});
  Tensor y = add(mul(x, 2.0), exp(x * 0.0));  // dy/dx = 2 (+ 0)
  Tensor z = mul(y, x);                       // x used again
  z.backward();                               // d/dx (2x^2 + x) = 4x + 1
  EXPECT_DOUBLE_EQ(x.grad().item(), 13);
}

TEST(Autograd, DetachAndNoGradStopRecording) {
  Tensor x = leaf({1, 2}, {2});
  Tensor d = x.detach();
  EXPECT_FALSE(d.requires_grad());
  EXPECT_EQ(d.data_ptr(), x.data_ptr());
  EXPECT_FALSE(mul(d, 2.0).requires_grad());
  {
    NoGradGuard guard;
    EXPECT_FALSE(grad_mode_enabled());
    Tensor y = mul(x, 2.0);
    EXPECT_FALSE(y.requires_grad());
    EXPECT_EQ(y.grad_fn(), nullptr);
  }
  EXPECT_TRUE(grad_mode_enabled());
  Tensor y = add(mul(x, x), mul(d, 5.0));  // only the first term carries gradient
  sum(y).backward();
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{2, 4}));
}

TEST(Autograd, ZeroGradInPlaceKeepsTheBufferThatSetGradInstalled) {
  Tensor w = leaf({1, 2, 3}, {3});
  Tensor bucket = zeros({5}, kF64);
  Tensor view = make_view(bucket, {3}, {1}, 1);  // elements 1..3 of the bucket
  w.set_grad(view);
  sum(mul(w, w)).backward();
  EXPECT_EQ(bucket.to_vector<double>(), (std::vector<double>{0, 2, 4, 6, 0}));
  EXPECT_EQ(w.grad().data_ptr(), view.data_ptr());
  w.zero_grad();
  EXPECT_EQ(w.grad().data_ptr(), view.data_ptr());
  EXPECT_EQ(bucket.to_vector<double>(), std::vector<double>(5, 0.0));
  sum(mul(w, 10.0)).backward();
  EXPECT_EQ(bucket.to_vector<double>(), (std::vector<double>{0, 10, 10, 10, 0}));
  w.zero_grad(/*set_to_none=*/true);
  EXPECT_FALSE(w.grad().defined());
}

// zero_grad() defers the zeroing (AutogradMeta::grad_zero_pending): the next backward overwrites the
// old gradient, a leaf reached by two paths gets their sum and not old + sum, and the buffer installed
// by set_grad is the one written, with its neighbours untouched.
TEST(Autograd, ZeroGradThenBackwardOverwritesWithoutReadingTheOldGradient) {
  Tensor w = leaf({1, 2, 3}, {3});
  Tensor bucket = full({5}, 7.0, kF64);
  Tensor view = make_view(bucket, {3}, {1}, 1);
  w.set_grad(view);
  sum(mul(w, w)).backward();  // 7 + 2w
  EXPECT_EQ(bucket.to_vector<double>(), (std::vector<double>{7, 9, 11, 13, 7}));
  w.zero_grad();
  Tensor y = add(mul(w, 10.0), mul(w, w));  // two paths into w: 10 + 2w
  sum(y).backward();
  EXPECT_EQ(bucket.to_vector<double>(), (std::vector<double>{7, 12, 14, 16, 7}));
  EXPECT_EQ(w.grad().data_ptr(), view.data_ptr());
  sum(mul(w, 1.0)).backward();  // no zero_grad in between: accumulates
  EXPECT_EQ(bucket.to_vector<double>(), (std::vector<double>{7, 13, 15, 17, 7}));
  // Zeroed and never written: a reader sees zeros in the installed buffer.
  w.zero_grad();
  EXPECT_EQ(w.grad().to_vector<double>(), std::vector<double>(3, 0.0));
  EXPECT_EQ(bucket.to_vector<double>(), (std::vector<double>{7, 0, 0, 0, 7}));
  // set_grad after zero_grad installs the new buffer as it is (nothing pending on it).
  w.zero_grad();
  Tensor fresh = from_vector(std::vector<double>{4, 5, 6}, {3}, kF64);
  w.set_grad(fresh);
  EXPECT_EQ(w.grad().to_vector<double>(), (std::vector<double>{4, 5, 6}));
}

// An op that scales w by 3 and, in backward, writes its gradient straight into w's buffer when that buffer
// awaits its first gradient (first_grad_buffer), returning it as usual otherwise.
Tensor scale_writing_in_place(const Tensor& w, int* written) {
  Tensor out = mul(w.detach(), 3.0);
  record_op("ScaleWritingInPlace", {w}, {out}, [w, written](const std::vector<Tensor>& grads) {
    Tensor g = mul(grads[0], 3.0);
    Tensor into = first_grad_buffer(w);
    if (!into.defined()) return std::vector<Tensor>{g};
    into.copy_(g);
    mark_grad_written(w);
    ++*written;
    return std::vector<Tensor>{Tensor()};
  });
  return out;
}

// An op's backward may write a leaf's first gradient since zero_grad() into its buffer itself: the
// buffer (a bucket view) gets it, the other uses of the leaf add theirs, the hook fires once with the
// final sum, and without a zero_grad in between the op returns its gradient and autograd accumulates.
TEST(Autograd, AnOpMayWriteALeafsFirstGradientIntoItsBufferItself) {
  Tensor w = leaf({1, 2, 3}, {3});
  Tensor bucket = full({5}, 7.0, kF64);
  Tensor view = make_view(bucket, {3}, {1}, 1);
  w.set_grad(view);
  int written = 0, hooks = 0;
  std::vector<double> seen;
  w.register_grad_ready_hook([&](const Tensor& leaf) {
    ++hooks;
    seen = leaf.grad().to_vector<double>();
  });
  // Nothing pending (set_grad installs the buffer as it is): the op returns its gradient.
  sum(scale_writing_in_place(w, &written)).backward();
  EXPECT_EQ(written, 0);
  EXPECT_EQ(bucket.to_vector<double>(), (std::vector<double>{7, 10, 10, 10, 7}));
  // After zero_grad the op writes 3 into the buffer; the second use of w (w * w) adds 2w.
  w.zero_grad();
  sum(add(scale_writing_in_place(w, &written), mul(w, w))).backward();
  EXPECT_EQ(written, 1);
  EXPECT_EQ(hooks, 2);
  EXPECT_EQ(seen, (std::vector<double>{5, 7, 9}));
  EXPECT_EQ(bucket.to_vector<double>(), (std::vector<double>{7, 5, 7, 9, 7}));
  EXPECT_EQ(w.grad().data_ptr(), view.data_ptr());
  // Used twice by the op itself: the first backward to run writes, the second returns its gradient.
  w.zero_grad();
  sum(add(scale_writing_in_place(w, &written), scale_writing_in_place(w, &written))).backward();
  EXPECT_EQ(written, 2);
  EXPECT_EQ(hooks, 3);
  EXPECT_EQ(bucket.to_vector<double>(), (std::vector<double>{7, 6, 6, 6, 7}));
  // The op the only use of w: the hook still fires, with what the op wrote.
  w.zero_grad();
  sum(scale_writing_in_place(w, &written)).backward();
  EXPECT_EQ(written, 3);
  EXPECT_EQ(hooks, 4);
  EXPECT_EQ(seen, (std::vector<double>{3, 3, 3}));
  // No zero_grad in between: accumulated through autograd.
  sum(scale_writing_in_place(w, &written)).backward();
  EXPECT_EQ(written, 3);
  EXPECT_EQ(bucket.to_vector<double>(), (std::vector<double>{7, 6, 6, 6, 7}));
  // Not a leaf, or no buffer yet: nothing to write into.
  Tensor fresh = leaf({1}, {1});
  EXPECT_FALSE(first_grad_buffer(fresh).defined());
  EXPECT_FALSE(first_grad_buffer(mul(w, 1.0)).defined());
  EXPECT_THROW(mark_grad_written(w), Error);
}

// grad_out_for hands out a leaf's buffer only while it awaits its first gradient and fits the gradient's
// shape, dtype and device; grad_formed marks it written (the backward returns nothing for the leaf) and
// passes any other tensor through, so a second request for the same leaf gets a tensor of its own.
TEST(Autograd, GradOutForHandsOutALeafsBufferOnceAndGradFormedMarksIt) {
  Tensor w = leaf({1, 2, 3}, {3});
  Tensor bucket = full({5}, 7.0, kF64);
  Tensor view = make_view(bucket, {3}, {1}, 1);
  w.set_grad(view);
  const TensorOptions f64 = TensorOptions{}.with_dtype(DType::Float64);
  // Nothing pending: a new tensor, returned as it is.
  Tensor fresh = grad_out_for(w, {3}, f64);
  EXPECT_NE(fresh.data_ptr(), view.data_ptr());
  EXPECT_EQ(grad_formed(w, fresh).impl(), fresh.impl());
  w.zero_grad();
  EXPECT_NE(grad_out_for(w, {3}, TensorOptions{}.with_dtype(DType::Float32)).data_ptr(), view.data_ptr());
  EXPECT_NE(grad_out_for(w, {1, 3}, f64).data_ptr(), view.data_ptr());
  EXPECT_NE(grad_out_for(Tensor(), {3}, f64).data_ptr(), view.data_ptr());
  Tensor into = grad_out_for(w, {3}, f64);
  ASSERT_EQ(into.data_ptr(), view.data_ptr());
  into.copy_(from_vector(std::vector<double>{4, 5, 6}, {3}, kF64));
  EXPECT_FALSE(grad_formed(w, into).defined());
  Tensor second = grad_out_for(w, {3}, f64);
  EXPECT_NE(second.data_ptr(), view.data_ptr());
  EXPECT_TRUE(grad_formed(w, second).defined());
  EXPECT_EQ(bucket.to_vector<double>(), (std::vector<double>{7, 4, 5, 6, 7}));
}

// Each op's saved tensors are released once its backward has run, as PyTorch does without
// retain_graph: a loss the caller keeps (a training loop's `loss = step()`) pins no activation into the
// next step, and a second backward through the graph is an error naming the op.
TEST(Autograd, BackwardReleasesWhatEachOpSavedAndASecondBackwardIsAnError) {
  Tensor x = leaf({1, 2, 3}, {3});
  Tensor a = exp(x);  // an activation: mul saves it for backward
  std::weak_ptr<Storage> activation = a.impl()->storage;
  Tensor loss = sum(mul(a, a));
  a = Tensor();
  EXPECT_FALSE(activation.expired()) << "the graph must hold the saved activation until backward";
  loss.backward();
  EXPECT_TRUE(activation.expired()) << "backward must release the saved activation";
  EXPECT_NEAR(x.grad().to_vector<double>()[2], 2 * std::exp(6.0), 1e-9);  // d/dx e^{2x} = 2 e^{2x}
  try {
    loss.backward();
    FAIL() << "a second backward ran on released saved tensors";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("second backward"), std::string::npos) << e.what();
  }
}

TEST(Autograd, NonScalarBackwardNeedsAGradient) {
  Tensor x = leaf({1, 2}, {2});
  Tensor y = mul(x, 3.0);
  EXPECT_THROW(y.backward(), Error);
  y.backward(from_vector(std::vector<double>{1, 10}, {2}, kF64));
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{3, 30}));
}

TEST(Autograd, IntegerTensorsCannotRequireGrad) {
  Tensor i = zeros({2}, TensorOptions{}.with_dtype(DType::Int64));
  EXPECT_THROW(i.requires_grad_(true), Error);
}

TEST(Autograd, GradientsConvertToTheLeafDtype) {
  Tensor x = leaf({1, 2}, {2});
  sum(mul(x.to(DType::Float32), 2.0)).backward();
  EXPECT_EQ(x.grad().dtype(), DType::Float64);
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{2, 2}));
}

TEST(Autograd, SumToShapeReducesBroadcastDims) {
  Tensor g = ones({3, 2, 4}, kF64);
  EXPECT_EQ(sum_to_shape(g, {2, 1}).to_vector<double>(), (std::vector<double>{12, 12}));
  EXPECT_EQ(sum_to_shape(g, {3, 1, 4}).shape(), (Shape{3, 1, 4}));
  EXPECT_EQ(sum_to_shape(g, {}).item(), 24);
}

// --- grad-ready hooks ------------------------------------------------------------------------

struct HookLog {
  std::vector<std::string> order;
  std::vector<std::vector<double>> grads;
};

void watch(const Tensor& t, const std::string& name, HookLog* log) {
  t.register_grad_ready_hook([name, log](const Tensor& leaf) {
    log->order.push_back(name);
    log->grads.push_back(leaf.grad().to_vector<double>());
  });
}

// Three 3 x 3 weights whose hooks log "layer1".."layer3".
std::vector<Tensor> watched_layers(Generator& gen, HookLog* log) {
  std::vector<Tensor> w;
  for (int i = 0; i < 3; ++i) {
    w.push_back(randn({3, 3}, gen, kF64.with_requires_grad(true)));
    watch(w.back(), "layer" + std::to_string(i + 1), log);
  }
  return w;
}

TEST(GradReadyHook, FiresInReverseOrderOfLastUseForAThreeLayerChain) {
  Generator gen(0);
  Tensor x = randn({2, 3}, gen, kF64);
  HookLog log;
  std::vector<Tensor> w = watched_layers(gen, &log);
  Tensor h = x;
  for (int i = 0; i < 3; ++i) h = tanh(matmul(h, w[static_cast<size_t>(i)]));
  sum(h).backward();
  EXPECT_EQ(log.order, (std::vector<std::string>{"layer3", "layer2", "layer1"}));
  // Each hook saw the final gradient, before backward returned.
  for (int i = 0; i < 3; ++i)
    EXPECT_EQ(log.grads[static_cast<size_t>(2 - i)], w[static_cast<size_t>(i)].grad().to_vector<double>());
}

// An identity op whose backward logs its name: marks where backward is between two layers.
Tensor logged_identity(const Tensor& t, const std::string& name, HookLog* log) {
  Tensor out = mul(t.detach(), 1.0);
  record_op("logged_identity", {t}, {out}, [name, log](const std::vector<Tensor>& g) {
    log->order.push_back(name);
    return std::vector<Tensor>{g[0]};
  });
  return out;
}

TEST(GradReadyHook, FiresBeforeEarlierLayersRunEvenWhileThePreviousStepsGraphIsAlive) {
  Generator gen(0);
  Tensor x = randn({2, 3}, gen, kF64);
  HookLog log;
  std::vector<Tensor> w = watched_layers(gen, &log);
  auto forward = [&] {
    Tensor h = x;
    for (int i = 0; i < 3; ++i) {
      if (i > 0) h = logged_identity(h, "into layer" + std::to_string(i + 1), &log);
      h = tanh(matmul(h, w[static_cast<size_t>(i)]));
    }
    return sum(h);
  };
  const std::vector<std::string> interleaved{"layer3", "into layer3", "layer2", "into layer2", "layer1"};
  Tensor first = forward();
  first.backward();
  EXPECT_EQ(log.order, interleaved);
  // `first` still holds its graph, so this forward pass reuses the leaves' AccumulateGrad nodes, made
  // before any node of the new graph. Each must still run as soon as its layer's gradient is final.
  log.order.clear();
  Tensor second = forward();
  second.backward();
  EXPECT_EQ(log.order, interleaved);
}

TEST(GradReadyHook, FiresOncePerBackwardAfterEveryUseOfTheLeaf) {
  Tensor w = leaf({2}, {1});
  HookLog log;
  watch(w, "w", &log);
  // w is used first and last; its gradient is final only after both uses have delivered.
  Tensor y = mul(w, 3.0);
  Tensor z = mul(exp(y * 0.0) + y, w);  // (1 + 3w) w -> dz/dw = 1 + 6w = 13
  z.backward();
  ASSERT_EQ(log.order.size(), 1u);
  EXPECT_EQ(log.grads[0], (std::vector<double>{13}));
  // A second backward fires the hook again, once, with the accumulated gradient.
  mul(w, 1.0).backward();
  ASSERT_EQ(log.order.size(), 2u);
  EXPECT_EQ(log.grads[1], (std::vector<double>{14}));
}

TEST(GradReadyHook, LeafUsedEarlyAndLateIsReportedAtItsLastUse) {
  // a is used by layer 1 and again after layer 2; b only in layer 2. Last uses: a after b.
  Tensor a = leaf({1, 2}, {2});
  Tensor b = leaf({3, 4}, {2});
  HookLog log;
  watch(a, "a", &log);
  watch(b, "b", &log);
  Tensor h1 = tanh(mul(a, 0.5));
  Tensor h2 = tanh(mul(h1, b));
  Tensor out = sum(mul(h2, a));
  out.backward();
  EXPECT_EQ(log.order, (std::vector<std::string>{"b", "a"}));
  EXPECT_EQ(log.grads[1], a.grad().to_vector<double>());
}

TEST(GradReadyHook, OnlyLeavesThatRequireGradAcceptHooks) {
  Tensor x = zeros({2}, kF64);
  EXPECT_THROW(x.register_grad_ready_hook([](const Tensor&) {}), Error);
}

}  // namespace
}  // namespace dpt
