// cross_entropy(Tensor&&) turns logits nobody else holds into their gradient during the forward pass
// (core/ops_loss.cpp, kernels::cross_entropy_with_grad). The promises pinned here: the forward really
// does it; loss and gradient are bitwise those of the two-pass path (same row statistics, same formula);
// an upstream gradient other than 1 scales the result; logits someone still holds, or a forward without
// a backward to come, are left alone; and the CUDA kernel agrees with the CPU and with its own two-pass
// kernels at a warp-sized row and at a GPT-2 vocabulary row that starts anywhere.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "core/autograd.h"
#include "core/cuda_runtime.h"
#include "core/factory.h"
#include "core/ops.h"

namespace dpt {
namespace {

constexpr int64_t kIgnore = -100;

struct Problem {
  Tensor h, w, targets;
};

// logits = h @ w, so the weight gradient carries the logits' gradient back; every third target ignored.
Problem make_problem(int64_t rows, int64_t features, int64_t classes, const TensorOptions& options) {
  Generator gen(11);
  Problem p;
  p.h = randn({rows, features}, gen, options);
  p.w = randn({features, classes}, gen, options);
  p.w.requires_grad_(true);
  std::vector<int64_t> t = randint({rows}, 0, classes, gen, TensorOptions{}.with_dtype(DType::Int64)).to_vector<int64_t>();
  for (size_t i = 0; i < t.size(); i += 3) t[i] = kIgnore;
  p.targets = from_vector(t, {rows}, options.with_dtype(DType::Int64).with_requires_grad(false));
  return p;
}

struct Result {
  std::vector<double> loss, grad;  // the loss, and the gradient of the tensor a test follows
};

Result take_grad(const Problem& p, const Tensor& loss, double upstream) {
  (upstream == 1 ? loss : mul(loss, upstream)).backward();
  Result r{{loss.item()}, p.w.grad().to(Device::cpu()).to(DType::Float64).to_vector<double>()};
  p.w.zero_grad(true);
  return r;
}

// The handed-over path: the temporary from matmul has no other holder.
Result fused(const Problem& p, double upstream = 1) {
  Tensor loss = cross_entropy(matmul(p.h, p.w), p.targets, kIgnore);
  return take_grad(p, loss, upstream);
}

// The two-pass path: the caller keeps its logits.
Result two_pass(const Problem& p, double upstream = 1) {
  Tensor logits = matmul(p.h, p.w);
  Tensor loss = cross_entropy(logits, p.targets, kIgnore);
  return take_grad(p, loss, upstream);
}

double squared_norm(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x * x;
  return s;
}

TEST(CrossEntropyFused, ForwardLeavesTheGradientInTheLogitsBuffer) {
  const TensorOptions f64 = TensorOptions{}.with_dtype(DType::Float64);
  Tensor logits = from_vector<double>({1, 2, 3, 0, 0, 0}, {2, 3}, f64.with_requires_grad(true));
  Tensor targets = from_vector<int64_t>({2, 0}, {2}, TensorOptions{}.with_dtype(DType::Int64));
  const double* raw = logits.data<double>();  // the buffer stays alive inside the backward closure
  Tensor loss = cross_entropy(std::move(logits), targets);
  EXPECT_EQ(loss.grad_fn()->name(), "CrossEntropyFusedBackward");
  // Row 0: softmax(1, 2, 3) = (0.0900, 0.2447, 0.6652); row 1: uniform. Mean over 2 rows.
  const double z = std::exp(1.0) + std::exp(2.0) + std::exp(3.0);
  const std::vector<double> expected = {std::exp(1.0) / z / 2, std::exp(2.0) / z / 2, (std::exp(3.0) / z - 1) / 2,
                                        (1.0 / 3 - 1) / 2,     1.0 / 6,               1.0 / 6};
  for (size_t i = 0; i < expected.size(); ++i) EXPECT_NEAR(raw[i], expected[i], 1e-15) << i;
  EXPECT_NEAR(loss.item(), (std::log(z) - 3 + std::log(3.0)) / 2, 1e-15);
}

TEST(CrossEntropyFused, SameLossAndGradientAsTheTwoPassPath) {
  for (DType dtype : {DType::Float64, DType::Float32, DType::BFloat16}) {
    Problem p = make_problem(12, 6, 37, TensorOptions{}.with_dtype(dtype));
    const Result a = fused(p), b = two_pass(p);
    EXPECT_EQ(a.loss, b.loss) << dtype_name(dtype);
    EXPECT_EQ(a.grad, b.grad) << dtype_name(dtype);
    EXPECT_GT(squared_norm(a.grad), 0.01) << dtype_name(dtype);
  }
}

TEST(CrossEntropyFused, UpstreamGradientScalesTheResult) {
  Problem p = make_problem(9, 5, 11, TensorOptions{}.with_dtype(DType::Float64));
  const Result a = fused(p, 3.0), b = two_pass(p, 3.0), one = fused(p);
  ASSERT_EQ(a.grad.size(), b.grad.size());
  for (size_t i = 0; i < a.grad.size(); ++i) {
    EXPECT_NEAR(a.grad[i], b.grad[i], 1e-12) << i;
    EXPECT_NEAR(a.grad[i], 3 * one.grad[i], 1e-12) << i;
  }
}

TEST(CrossEntropyFused, HeldOrGradlessLogitsAreLeftAlone) {
  Problem p = make_problem(6, 4, 9, TensorOptions{}.with_dtype(DType::Float64));
  Tensor logits = matmul(p.h, p.w);
  const std::vector<double> before = logits.to_vector<double>();
  Tensor view = logits.reshape({-1});  // a second holder of the buffer
  Tensor loss = cross_entropy(std::move(logits), p.targets, kIgnore);
  EXPECT_EQ(view.to_vector<double>(), before) << "the forward overwrote logits a view still shows";
  loss.backward();
  EXPECT_EQ(view.to_vector<double>(), before) << "the backward overwrote logits a view still shows";

  // No backward to come: a sole holder is left alone too. cross_entropy(Tensor&&) binds the argument without
  // moving from it, so `eval_logits` still owns the buffer after the call.
  NoGradGuard no_grad;
  Tensor eval_logits = matmul(p.h, p.w);
  const std::vector<double> eval_before = eval_logits.to_vector<double>();
  Tensor eval_loss = cross_entropy(std::move(eval_logits), p.targets, kIgnore);
  EXPECT_EQ(eval_logits.to_vector<double>(), eval_before) << "no backward, yet overwritten";  // NOLINT(bugprone-use-after-move)
}

// The CUDA kernels on logits given directly (a leaf, handed over as mul(leaf, 1), which is exact), so the
// CPU reference sees the very same logits: only the kernels' arithmetic differs, not a GEMM's rounding.
TEST(CrossEntropyFused, CudaMatchesItsTwoPassKernelsAndTheCpu) {
  if (!cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  // 37 classes take the warp-sized row; 50257 the 512-thread row, with rows starting off 16 bytes.
  for (int64_t classes : {int64_t{37}, int64_t{50257}}) {
    for (DType dtype : {DType::Float32, DType::BFloat16}) {
      SCOPED_TRACE(std::to_string(classes) + " classes, " + dtype_name(dtype));
      const TensorOptions gpu = TensorOptions{}.with_dtype(dtype).with_device(Device::cuda(0));
      Problem p = make_problem(24, 1, classes, gpu);
      Generator gen(5);
      Tensor leaf = mul(randn({24, classes}, gen, gpu), 4.0).detach();
      leaf.requires_grad_(true);
      auto gradient = [&](bool hand_over, double upstream, const char* node) {
        Tensor logits = mul(leaf, 1.0);
        Tensor loss = hand_over ? cross_entropy(std::move(logits), p.targets, kIgnore)
                                : cross_entropy(logits, p.targets, kIgnore);
        EXPECT_EQ(loss.grad_fn()->name(), node);
        (upstream == 1 ? loss : mul(loss, upstream)).backward();
        Result r{{loss.item()}, leaf.grad().to(Device::cpu()).to(DType::Float64).to_vector<double>()};
        leaf.zero_grad(true);
        return r;
      };
      const Result fused_one = gradient(true, 1, "CrossEntropyFusedBackward");
      const Result two_pass_one = gradient(false, 1, "CrossEntropyBackward");
      EXPECT_EQ(fused_one.loss, two_pass_one.loss);
      EXPECT_EQ(fused_one.grad, two_pass_one.grad);
      // Halving is exact in float32 and bfloat16 (no subnormals here): bitwise half the gradient.
      const Result fused_half = gradient(true, 0.5, "CrossEntropyFusedBackward");
      std::vector<double> half = fused_one.grad;
      for (double& v : half) v *= 0.5;
      EXPECT_EQ(fused_half.grad, half);

      Tensor cpu_leaf = leaf.detach().to(Device::cpu()).to(DType::Float64);
      cpu_leaf.requires_grad_(true);
      Tensor cpu_loss = cross_entropy(cpu_leaf, p.targets.to(Device::cpu()), kIgnore);
      cpu_loss.backward();
      const std::vector<double> ref = cpu_leaf.grad().to_vector<double>();
      // float32 statistics either way; bfloat16 rounds each gradient element once (2^-9 relative).
      const double rel = dtype == DType::Float32 ? 1e-5 : 4e-3;
      EXPECT_NEAR(fused_one.loss[0], cpu_loss.item(), 1e-5 * std::abs(cpu_loss.item()));
      ASSERT_EQ(fused_one.grad.size(), ref.size());
      int bad = 0;
      for (size_t i = 0; i < ref.size(); ++i) {
        if (std::abs(fused_one.grad[i] - ref[i]) > rel * std::abs(ref[i]) + 1e-9 && ++bad <= 5)
          ADD_FAILURE() << "element " << i << ": " << fused_one.grad[i] << " vs CPU " << ref[i];
      }
      EXPECT_EQ(bad, 0);
      EXPECT_GT(squared_norm(ref), 1e-4);
    }
  }
}

}  // namespace
}  // namespace dpt
