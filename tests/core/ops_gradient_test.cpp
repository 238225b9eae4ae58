// Finite-difference gradient checks (float64) of every op in core/ops.h, broadcasting included.
#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>

#include "core/autograd.h"
#include "core/factory.h"
#include "core/kernels.h"
#include "core/ops.h"
#include "gradcheck.h"

namespace dpt {
namespace {

using Inputs = std::vector<Tensor>;
const TensorOptions kF64 = TensorOptions{}.with_dtype(DType::Float64);
constexpr double kTol = 1e-6;

class OpGradient : public ::testing::Test {
 protected:
  Tensor normal(const Shape& shape) { return randn(shape, gen_, kF64); }
  Tensor positive(const Shape& shape) { return rand(shape, gen_, kF64, 0.5, 2.0); }
  Generator gen_{2024};
};

// The checker itself must fail on a wrong backward: here d(2x)/dx is reported as 3.
TEST_F(OpGradient, CheckerCatchesAWrongBackward) {
  auto wrong_double = [](const Inputs& x) {
    Tensor out = Tensor::empty(x[0].shape(), x[0].options());
    kernels::unary(kernels::UnaryOp::Scale, x[0].detach().contiguous(), out, 2.0);
    record_op("WrongBackward", {x[0]}, {out},
              [](const std::vector<Tensor>& g) { return std::vector<Tensor>{mul(g[0], 3.0)}; });
    return out;
  };
  Tensor x = normal({1});  // one element: exactly one failure
  EXPECT_NONFATAL_FAILURE(expect_gradients_match(wrong_double, {x}, kTol), "element");
}

TEST_F(OpGradient, BroadcastingBinaryOps) {
  // [3, 1, 4] with [2, 1] -> [3, 2, 4]: both operands are broadcast along different dims.
  Inputs in{normal({3, 1, 4}), normal({2, 1})};
  expect_gradients_match([](const Inputs& x) { return add(x[0], x[1]); }, in, kTol);
  expect_gradients_match([](const Inputs& x) { return sub(x[0], x[1]); }, in, kTol);
  expect_gradients_match([](const Inputs& x) { return mul(x[0], x[1]); }, in, kTol);
  expect_gradients_match([](const Inputs& x) { return div(x[0], x[1]); }, {normal({3, 1, 4}), positive({2, 1})}, kTol);
  // Same shapes, and a 0-d operand.
  expect_gradients_match([](const Inputs& x) { return x[0] * x[1] - x[0] / x[1]; }, {normal({2, 3}), positive({2, 3})},
                         kTol);
  expect_gradients_match([](const Inputs& x) { return x[0] * x[1]; }, {normal({2, 3}), normal({})}, kTol);
}

TEST_F(OpGradient, ScalarOps) {
  expect_gradients_match([](const Inputs& x) { return add(x[0], 2.5); }, {normal({2, 3})}, kTol);
  expect_gradients_match([](const Inputs& x) { return mul(x[0], -1.5); }, {normal({2, 3})}, kTol);
  expect_gradients_match([](const Inputs& x) { return -(x[0] / 2.0) + 3.0; }, {normal({4})}, kTol);
}

TEST_F(OpGradient, UnaryOps) {
  expect_gradients_match([](const Inputs& x) { return neg(x[0]); }, {normal({2, 3})}, kTol);
  expect_gradients_match([](const Inputs& x) { return exp(x[0]); }, {normal({2, 3})}, kTol);
  expect_gradients_match([](const Inputs& x) { return log(x[0]); }, {positive({2, 3})}, kTol);
  expect_gradients_match([](const Inputs& x) { return sqrt(x[0]); }, {positive({2, 3})}, kTol);
  expect_gradients_match([](const Inputs& x) { return pow(x[0], 2.5); }, {positive({2, 3})}, kTol);
  expect_gradients_match([](const Inputs& x) { return pow(x[0], 3.0); }, {normal({2, 3})}, kTol);
  expect_gradients_match([](const Inputs& x) { return relu(x[0]); }, {normal({3, 4})}, kTol);
  expect_gradients_match([](const Inputs& x) { return gelu(x[0]); }, {normal({3, 4})}, kTol);
  expect_gradients_match([](const Inputs& x) { return tanh(x[0]); }, {normal({3, 4})}, kTol);
  expect_gradients_match([](const Inputs& x) { return sigmoid(x[0]); }, {normal({3, 4})}, kTol);
}

TEST_F(OpGradient, UnaryOpsOnStridedViews) {
  expect_gradients_match([](const Inputs& x) { return exp(x[0].transpose(0, 1)); }, {normal({2, 3})}, kTol);
}

TEST_F(OpGradient, Reductions) {
  Tensor x = normal({2, 3, 4});
  expect_gradients_match([](const Inputs& v) { return sum(v[0]); }, {x}, kTol);
  expect_gradients_match([](const Inputs& v) { return mean(v[0]); }, {x}, kTol);
  for (int64_t dim : {0, 1, -1}) {
    for (bool keep : {false, true}) {
      expect_gradients_match([dim, keep](const Inputs& v) { return sum(v[0], dim, keep); }, {x}, kTol);
      expect_gradients_match([dim, keep](const Inputs& v) { return mean(v[0], dim, keep); }, {x}, kTol);
      expect_gradients_match([dim, keep](const Inputs& v) { return max(v[0], dim, keep); }, {x}, kTol);
    }
  }
}

TEST_F(OpGradient, MatmulWithEveryTransposeCombination) {
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      Tensor a = ta ? normal({4, 3}) : normal({3, 4});
      Tensor b = tb ? normal({5, 4}) : normal({4, 5});
      expect_gradients_match([ta, tb](const Inputs& x) { return matmul(x[0], x[1], ta, tb); }, {a, b}, kTol);
    }
  }
}

TEST_F(OpGradient, BatchedMatmul) {
  expect_gradients_match([](const Inputs& x) { return matmul(x[0], x[1]); }, {normal({2, 3, 4}), normal({2, 4, 2})},
                         kTol);
  expect_gradients_match([](const Inputs& x) { return matmul(x[0], x[1], true, true); },
                         {normal({2, 2, 4, 3}), normal({2, 2, 5, 4})}, kTol);
}

TEST_F(OpGradient, MatmulOfTransposedAndSlicedViews) {
  // Transposed views are read in place (flipped transpose flag); sliced ones are copied.
  expect_gradients_match([](const Inputs& x) { return matmul(x[0].transpose(0, 1), x[1]); },
                         {normal({4, 3}), normal({4, 2})}, kTol);
  expect_gradients_match([](const Inputs& x) { return matmul(x[0], x[1].transpose(-2, -1), false, true); },
                         {normal({2, 3, 4}), normal({2, 4, 3})}, kTol);
  expect_gradients_match([](const Inputs& x) { return matmul(x[0], x[1].transpose(-2, -1)); },
                         {normal({2, 3, 4}), normal({2, 5, 4})}, kTol);
  expect_gradients_match([](const Inputs& x) { return matmul(slice(x[0], 1, 1, 4), x[1]); },
                         {normal({3, 5}), normal({3, 2})}, kTol);
}

TEST_F(OpGradient, BatchedMatmulWithASharedTwoDimensionalOperand) {
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      // Shared weight on the right (a linear layer) ...
      Tensor a = ta ? normal({2, 4, 3}) : normal({2, 3, 4});
      Tensor w = tb ? normal({5, 4}) : normal({4, 5});
      expect_gradients_match([ta, tb](const Inputs& x) { return matmul(x[0], x[1], ta, tb); }, {a, w}, kTol);
      // ... and on the left.
      Tensor m = ta ? normal({4, 3}) : normal({3, 4});
      Tensor b = tb ? normal({2, 5, 4}) : normal({2, 4, 5});
      expect_gradients_match([ta, tb](const Inputs& x) { return matmul(x[0], x[1], ta, tb); }, {m, b}, kTol);
    }
  }
}

TEST_F(OpGradient, SoftmaxFamily) {
  expect_gradients_match([](const Inputs& x) { return softmax(x[0]); }, {normal({2, 3, 5})}, kTol);
  expect_gradients_match([](const Inputs& x) { return log_softmax(x[0]); }, {normal({2, 3, 5})}, kTol);
  expect_gradients_match([](const Inputs& x) { return softmax(x[0].transpose(0, 1)); }, {normal({4, 3})}, kTol);
}

TEST_F(OpGradient, ShapeOps) {
  Tensor x = normal({2, 3, 4});
  expect_gradients_match([](const Inputs& v) { return reshape(v[0], {4, -1}); }, {x}, kTol);
  expect_gradients_match([](const Inputs& v) { return transpose(v[0], 0, 2); }, {x}, kTol);
  expect_gradients_match([](const Inputs& v) { return permute(v[0], {1, 2, 0}); }, {x}, kTol);
  expect_gradients_match([](const Inputs& v) { return slice(v[0], 1, 1, 3); }, {x}, kTol);
  expect_gradients_match([](const Inputs& v) { return slice(v[0], 2, 0, 1); }, {x}, kTol);
  expect_gradients_match([](const Inputs& v) { return v[0][1]; }, {x}, kTol);
  expect_gradients_match([](const Inputs& v) { return reshape(transpose(v[0], 1, 2), {8, 3}); }, {x}, kTol);
}

TEST_F(OpGradient, CopiesPassGradientsThrough) {
  expect_gradients_match([](const Inputs& v) { return mul(v[0].clone(), v[0]); }, {normal({2, 3})}, kTol);
  expect_gradients_match([](const Inputs& v) { return v[0].transpose(0, 1).contiguous() * 2.0; }, {normal({2, 3})},
                         kTol);
}

TEST_F(OpGradient, ConcatAndSplit) {
  expect_gradients_match(
      [](const Inputs& v) {
        return concat({v[0], v[1]}, 0);
      },
      {normal({2, 3}), normal({1, 3})}, kTol);
  expect_gradients_match(
      [](const Inputs& v) {
        return concat({v[0], v[1], v[0]}, 1);
      },
      {normal({2, 2, 3}), normal({2, 1, 3})}, kTol);
  expect_gradients_match(
      [](const Inputs& v) {
        return concat({v[0], v[1]}, -1);
      },
      {normal({2, 3}), normal({2, 2})}, kTol);
  Tensor x = normal({2, 5, 3});
  expect_gradients_match([](const Inputs& v) { return split(v[0], {2, 3}, 1)[1]; }, {x}, kTol);
  expect_gradients_match(
      [](const Inputs& v) {
        auto parts = split(v[0], {1, 3, 1}, 1);
        return mul(parts[0], parts[2]) + sum(parts[1], 1, true);
      },
      {x}, kTol);
}

TEST_F(OpGradient, EmbeddingWithRepeatedIndices) {
  Tensor idx = from_vector(std::vector<int64_t>{1, 3, 1, 0, 1, 3}, {2, 3}, TensorOptions{}.with_dtype(DType::Int64));
  expect_gradients_match([](const Inputs& v) { return embedding(v[0], v[1]); }, {normal({4, 5}), idx}, kTol);
  Tensor idx32 = idx.to(DType::Int32);
  expect_gradients_match([](const Inputs& v) { return embedding(v[0], v[1]); }, {normal({4, 5}), idx32}, kTol);
}

TEST_F(OpGradient, CrossEntropyWithIgnoredTargets) {
  Tensor targets = from_vector(std::vector<int64_t>{2, -100, 0, 4}, {4}, TensorOptions{}.with_dtype(DType::Int64));
  expect_gradients_match([](const Inputs& v) { return cross_entropy(v[0], v[1]); }, {normal({4, 5}), targets}, kTol);
  Tensor targets32 = from_vector(std::vector<int32_t>{2, 1, 0, 4}, {4}, TensorOptions{}.with_dtype(DType::Int32));
  expect_gradients_match([](const Inputs& v) { return mul(cross_entropy(v[0], v[1], 0), 3.0); },
                         {normal({4, 5}), targets32}, kTol);
}

TEST_F(OpGradient, MseLossBothArguments) {
  expect_gradients_match([](const Inputs& v) { return mse_loss(v[0], v[1]); }, {normal({3, 4}), normal({3, 4})}, kTol);
}

TEST_F(OpGradient, CompositeChainThroughManyOps) {
  // A small MLP-like expression: every op's backward composed with the others.
  expect_gradients_match(
      [](const Inputs& v) {
        Tensor h = gelu(matmul(v[0], v[1]) + v[2]);
        return mean(log_softmax(matmul(h, v[1], false, true)));
      },
      {normal({3, 4}), normal({4, 4}), normal({4})}, kTol);
}

}  // namespace
}  // namespace dpt
