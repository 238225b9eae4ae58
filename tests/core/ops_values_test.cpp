// Known answers for the ops: hand-computed products, softmax rows, cross-entropy of uniform logits.
#include <gtest/gtest.h>

#include <cmath>

#include "core/error.h"
#include "core/factory.h"
#include "core/kernels.h"
#include "core/ops.h"

namespace dpt {
namespace {

const TensorOptions kF64 = TensorOptions{}.with_dtype(DType::Float64);
const TensorOptions kI64 = TensorOptions{}.with_dtype(DType::Int64);

Tensor f64(std::vector<double> v, const Shape& shape) { return from_vector(v, shape, kF64); }

TEST(OpValues, BroadcastAddMatchesHandComputedValues) {
  Tensor a = f64({0, 10, 20}, {3, 1});
  Tensor b = f64({1, 2}, {2});
  EXPECT_EQ(add(a, b).to_vector<double>(), (std::vector<double>{1, 2, 11, 12, 21, 22}));
  EXPECT_EQ(sub(b, a).shape(), (Shape{3, 2}));
  EXPECT_EQ(div(f64({6, 8}, {2}), f64({2}, {1})).to_vector<double>(), (std::vector<double>{3, 4}));
}

TEST(OpValues, MatmulMatchesHandComputedValues) {
  Tensor a = f64({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor b = f64({7, 8, 9, 10, 11, 12}, {3, 2});
  // [1 2 3; 4 5 6] @ [7 8; 9 10; 11 12] = [58 64; 139 154]
  EXPECT_EQ(matmul(a, b).to_vector<double>(), (std::vector<double>{58, 64, 139, 154}));
  // a^T @ a: [17 22 27; 22 29 36; 27 36 45]
  EXPECT_EQ(matmul(a, a, true, false).to_vector<double>(), (std::vector<double>{17, 22, 27, 22, 29, 36, 27, 36, 45}));
  // a @ a^T: [14 32; 32 77]
  EXPECT_EQ(matmul(a, a, false, true).to_vector<double>(), (std::vector<double>{14, 32, 32, 77}));
  // b^T @ a^T = (a b)^T
  EXPECT_EQ(matmul(b, a, true, true).to_vector<double>(), (std::vector<double>{58, 139, 64, 154}));
}

TEST(OpValues, BatchedMatmulSharesATwoDimensionalOperand) {
  Tensor x = f64({1, 0, 0, 1, 2, 0, 0, 2}, {2, 2, 2});  // [I, 2I]
  Tensor w = f64({1, 2, 3, 4}, {2, 2});
  EXPECT_EQ(matmul(x, w).to_vector<double>(), (std::vector<double>{1, 2, 3, 4, 2, 4, 6, 8}));
  EXPECT_EQ(matmul(w, x).to_vector<double>(), (std::vector<double>{1, 2, 3, 4, 2, 4, 6, 8}));
  EXPECT_THROW(matmul(zeros({2, 2, 2}, kF64), zeros({3, 2, 2}, kF64)), Error);
}

TEST(OpValues, FloatAndBFloat16MatmulAgreeWithDouble) {
  Generator gen(1);
  Tensor a = randn({8, 16}, gen, kF64), b = randn({16, 4}, gen, kF64);
  auto ref = matmul(a, b).to_vector<double>();
  auto f32 = matmul(a.to(DType::Float32), b.to(DType::Float32)).to_vector<double>();
  auto bf = matmul(a.to(DType::BFloat16), b.to(DType::BFloat16));
  EXPECT_EQ(bf.dtype(), DType::BFloat16);
  auto bfv = bf.to_vector<double>();
  for (size_t i = 0; i < ref.size(); ++i) {
    EXPECT_NEAR(f32[i], ref[i], 1e-5);
    EXPECT_NEAR(bfv[i], ref[i], 0.1 + 0.02 * std::abs(ref[i]));  // bf16 inputs carry 8 bits
  }
}

TEST(OpValues, SoftmaxRowsSumToOneAndLogSoftmaxIsItsLog) {
  Generator gen(2);
  Tensor x = mul(randn({5, 7}, gen, kF64), 10.0);
  Tensor p = softmax(x);
  auto rows = sum(p, 1).to_vector<double>();
  for (double r : rows) EXPECT_NEAR(r, 1.0, 1e-12);
  auto lp = log_softmax(x).to_vector<double>();
  auto pv = p.to_vector<double>();
  for (size_t i = 0; i < pv.size(); ++i) EXPECT_NEAR(std::exp(lp[i]), pv[i], 1e-12);
  // Large logits do not overflow: the row maximum is subtracted first.
  auto big = softmax(f64({1000, 1000}, {1, 2})).to_vector<double>();
  EXPECT_EQ(big, (std::vector<double>{0.5, 0.5}));
}

TEST(OpValues, ReductionsAndArgmaxTakeTheFirstMaximum) {
  Tensor x = f64({3, 1, 3, 2, 5, 5}, {2, 3});
  EXPECT_EQ(sum(x).item(), 19);
  EXPECT_EQ(sum(x, 0).to_vector<double>(), (std::vector<double>{5, 6, 8}));
  EXPECT_EQ(mean(x, 1, true).shape(), (Shape{2, 1}));
  EXPECT_NEAR(mean(x, 1).to_vector<double>()[0], 7.0 / 3, 1e-15);
  EXPECT_EQ(mean(x, 1).to_vector<double>()[1], 4);
  EXPECT_EQ(max(x, 1).to_vector<double>(), (std::vector<double>{3, 5}));
  Tensor am = argmax(x, 1);
  EXPECT_EQ(am.dtype(), DType::Int64);
  EXPECT_EQ(am.to_vector<int64_t>(), (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(argmax(x, 0).to_vector<int64_t>(), (std::vector<int64_t>{0, 1, 1}));
}

TEST(OpValues, MaxGradientGoesToTheFirstMaximumOnly) {
  Tensor x = f64({3, 1, 3}, {1, 3});
  x.requires_grad_(true);
  sum(max(x, 1)).backward();
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{1, 0, 0}));
}

TEST(OpValues, UnaryKnownValues) {
  Tensor x = f64({-1, 0, 2}, {3});
  EXPECT_EQ(relu(x).to_vector<double>(), (std::vector<double>{0, 0, 2}));
  EXPECT_NEAR(gelu(x).to_vector<double>()[2], 1.9545976, 1e-6);  // 0.5 * 2 * (1 + tanh(0.79788 * 2.35772))
  EXPECT_NEAR(sigmoid(x).to_vector<double>()[1], 0.5, 1e-15);
  EXPECT_NEAR(tanh(x).to_vector<double>()[0], std::tanh(-1.0), 1e-15);
  EXPECT_EQ(pow(x, 2).to_vector<double>(), (std::vector<double>{1, 0, 4}));
  EXPECT_EQ(sqrt(f64({4, 9}, {2})).to_vector<double>(), (std::vector<double>{2, 3}));
}

TEST(OpValues, CrossEntropyOfUniformLogitsIsLogC) {
  const int64_t classes = 10;
  Tensor logits = full({6, classes}, 0.3, kF64);
  Tensor targets = from_vector(std::vector<int64_t>{0, 1, 2, 9, 5, 3}, {6}, kI64);
  EXPECT_NEAR(cross_entropy(logits, targets).item(), std::log(10.0), 1e-12);
  Tensor f32 = cross_entropy(logits.to(DType::Float32), targets);
  EXPECT_EQ(f32.dtype(), DType::Float32);
  EXPECT_NEAR(f32.item(), std::log(10.0), 1e-6);
  EXPECT_NEAR(cross_entropy(logits.to(DType::BFloat16), targets).item(), std::log(10.0), 1e-6);
}

TEST(OpValues, CrossEntropyExcludesIgnoredTargetsFromTheMean) {
  // Row 0 (target 0) has loss -log softmax = log(1 + e^2) - ... computed directly below; row 1 ignored.
  Tensor logits = f64({2, 0, 100, -100}, {2, 2});
  Tensor targets = from_vector(std::vector<int64_t>{1, -100}, {2}, kI64);
  double row0 = std::log(std::exp(2.0) + 1.0);  // -log(e^0 / (e^2 + e^0))
  EXPECT_NEAR(cross_entropy(logits, targets).item(), row0, 1e-12);
  // Every target ignored: the loss is 0 and its gradient is 0, not NaN.
  Tensor all_ignored = from_vector(std::vector<int64_t>{-100, -100}, {2}, kI64);
  Tensor x = logits.detach().clone();
  x.requires_grad_(true);
  Tensor loss = cross_entropy(x, all_ignored);
  EXPECT_EQ(loss.item(), 0.0);
  loss.backward();
  EXPECT_EQ(x.grad().to_vector<double>(), std::vector<double>(4, 0.0));
  EXPECT_THROW(cross_entropy(logits, from_vector(std::vector<int64_t>{0, 2}, {2}, kI64)), Error);
}

TEST(OpValues, CrossEntropyMatchesLogSoftmax) {
  Generator gen(4);
  Tensor logits = randn({8, 6}, gen, kF64);
  Tensor targets = randint({8}, 0, 6, gen, kI64);
  auto lp = log_softmax(logits).to_vector<double>();
  auto t = targets.to_vector<int64_t>();
  double expected = 0;
  for (size_t r = 0; r < 8; ++r) expected -= lp[r * 6 + static_cast<size_t>(t[r])] / 8;
  EXPECT_NEAR(cross_entropy(logits, targets).item(), expected, 1e-12);
}

TEST(OpValues, EmbeddingGathersRowsAndScatterAddsGradients) {
  Tensor w = f64({0, 1, 10, 11, 20, 21}, {3, 2});
  w.requires_grad_(true);
  Tensor idx = from_vector(std::vector<int64_t>{2, 0, 2}, {3}, kI64);
  Tensor out = embedding(w, idx);
  EXPECT_EQ(out.shape(), (Shape{3, 2}));
  EXPECT_EQ(out.to_vector<double>(), (std::vector<double>{20, 21, 0, 1, 20, 21}));
  sum(out).backward();
  EXPECT_EQ(w.grad().to_vector<double>(), (std::vector<double>{1, 1, 0, 0, 2, 2}));
  EXPECT_THROW(embedding(w, from_vector(std::vector<int64_t>{3}, {1}, kI64)), Error);
}

TEST(OpValues, GatherRowsCopiesRowsOfAnyDtypeAndRefusesAnIndexOutOfRange) {
  const Tensor idx = from_vector(std::vector<int32_t>{2, 0, 2, 1}, {4}, TensorOptions{}.with_dtype(DType::Int32));
  const Tensor labels = from_vector(std::vector<int64_t>{7, -8, 9}, {3}, kI64);
  Tensor picked = Tensor::empty({4}, kI64);
  kernels::gather_rows(labels, idx, picked);
  EXPECT_EQ(picked.to_vector<int64_t>(), (std::vector<int64_t>{9, 7, 9, -8}));
  const Tensor images = f64({0, 1, 2, 3, 10, 11, 12, 13, 20, 21, 22, 23}, {3, 2, 2});
  Tensor out = Tensor::empty({4, 2, 2}, kF64);
  kernels::gather_rows(images, idx, out);
  EXPECT_EQ(out.to_vector<double>(), (std::vector<double>{20, 21, 22, 23, 0, 1, 2, 3, 20, 21, 22, 23, 10, 11, 12, 13}));
  try {
    kernels::gather_rows(labels, from_vector(std::vector<int64_t>{3}, {1}, kI64), Tensor::empty({1}, kI64));
    ADD_FAILURE() << "an index past the last row was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("gather_rows: index 3 out of range for 3 rows"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(kernels::gather_rows(images, idx, Tensor::empty({4, 4}, kF64)), Error);  // rows of another shape
}

TEST(OpValues, MseLossIsTheMeanSquaredDifference) {
  EXPECT_DOUBLE_EQ(mse_loss(f64({1, 2, 3}, {3}), f64({1, 0, 0}, {3})).item(), 13.0 / 3);
  EXPECT_THROW(mse_loss(zeros({3}, kF64), zeros({1}, kF64)), Error);
}

TEST(OpValues, ConcatAndSplitAlongAnInnerDim) {
  Tensor a = f64({1, 2, 3, 4}, {2, 2});
  Tensor b = f64({5, 6}, {2, 1});
  Tensor c = concat({a, b}, 1);
  EXPECT_EQ(c.to_vector<double>(), (std::vector<double>{1, 2, 5, 3, 4, 6}));
  auto parts = split(c, {1, 2}, 1);
  EXPECT_EQ(parts[0].to_vector<double>(), (std::vector<double>{1, 3}));
  EXPECT_EQ(parts[1].to_vector<double>(), (std::vector<double>{2, 5, 4, 6}));
  EXPECT_EQ(parts[1].data_ptr(), c.data<double>() + 1);  // a view
  EXPECT_THROW(split(c, {1, 1}, 1), Error);
  EXPECT_THROW(concat({a, zeros({3, 1}, kF64)}, 1), Error);
}

TEST(OpValues, BFloat16ElementwiseComputesInFloatAndRoundsOnStore) {
  Tensor a = from_vector(std::vector<float>{1.0f, 3.0f}, {2}, TensorOptions{}.with_dtype(DType::BFloat16));
  Tensor b = from_vector(std::vector<float>{1.0f / 256, 0.5f}, {2}, TensorOptions{}.with_dtype(DType::BFloat16));
  Tensor s = add(a, b);
  EXPECT_EQ(s.dtype(), DType::BFloat16);
  // 1 + 2^-8 is a tie between bf16 1 and 1 + 2^-7: rounds to even (1).
  EXPECT_EQ(s.to_vector<float>(), (std::vector<float>{1.0f, 3.5f}));
  EXPECT_NEAR(exp(a).to_vector<float>()[0], 2.71875f, 1e-6);  // e rounded to bf16
  EXPECT_NEAR(sum(a).item(), 4.0, 0);
}

}  // namespace
}  // namespace dpt
