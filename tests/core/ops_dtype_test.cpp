// Every op in float32, bfloat16 and float16 agrees with float64, forward and backward, within the
// precision of the dtype (bfloat16 keeps 8 significant bits, float16 11; their statistics and GEMM
// accumulation are float32).
#include <gtest/gtest.h>

#include <cmath>
#include <functional>

#include "core/factory.h"
#include "core/ops.h"

namespace dpt {
namespace {

using Inputs = std::vector<Tensor>;
using Fn = std::function<Tensor(const Inputs&)>;
const TensorOptions kF64 = TensorOptions{}.with_dtype(DType::Float64);

struct Result {
  std::vector<double> out;
  std::vector<std::vector<double>> grads;
};

// Runs f on copies of `inputs` converted to `dtype` (floating inputs only) and returns the output and
// the gradients of sum(out * w) for fixed weights w, all as float64.
Result run_in(DType dtype, const Fn& f, const Inputs& inputs) {
  Inputs leaves;
  for (const Tensor& x : inputs) {
    if (!is_floating(x.dtype())) {
      leaves.push_back(x);
      continue;
    }
    Tensor l = x.to(dtype).detach().clone();
    l.requires_grad_(true);
    leaves.push_back(l);
  }
  Tensor out = f(leaves);
  Generator gen(77);
  Tensor w = rand(out.shape(), gen, out.options(), 0.5, 1.5);
  sum(mul(out, w)).backward();
  Result r{out.to_vector<double>(), {}};
  for (const Tensor& l : leaves) {
    if (is_floating(l.dtype())) r.grads.push_back(l.grad().to_vector<double>());
  }
  return r;
}

void expect_close(const std::vector<double>& got, const std::vector<double>& want, double rtol, double atol,
                  const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_NEAR(got[i], want[i], atol + rtol * std::abs(want[i])) << what << " element " << i;
  }
}

void expect_dtypes_agree(const std::string& name, const Fn& f, const Inputs& inputs) {
  Result ref = run_in(DType::Float64, f, inputs);
  struct Case {
    DType dtype;
    double rtol, atol;
  };
  for (Case c : {Case{DType::Float32, 1e-5, 1e-5}, Case{DType::BFloat16, 3e-2, 3e-2},
                 Case{DType::Float16, 4e-3, 4e-3}}) {
    Result r = run_in(c.dtype, f, inputs);
    std::string what = name + " in " + dtype_name(c.dtype);
    expect_close(r.out, ref.out, c.rtol, c.atol, what + " output");
    ASSERT_EQ(r.grads.size(), ref.grads.size());
    for (size_t i = 0; i < r.grads.size(); ++i) {
      expect_close(r.grads[i], ref.grads[i], c.rtol, c.atol, what + " gradient " + std::to_string(i));
    }
  }
}

class OpDtypes : public ::testing::Test {
 protected:
  // Values that are exact in bfloat16, so only the op's own rounding is measured.
  Tensor normal(const Shape& shape) { return randn(shape, gen_, kF64).to(DType::BFloat16).to(DType::Float64); }
  Tensor positive(const Shape& shape) {
    return rand(shape, gen_, kF64, 0.5, 2.0).to(DType::BFloat16).to(DType::Float64);
  }
  Generator gen_{99};
};

TEST_F(OpDtypes, ElementwiseOps) {
  expect_dtypes_agree("add", [](const Inputs& x) { return add(x[0], x[1]); }, {normal({3, 1, 4}), normal({2, 1})});
  expect_dtypes_agree("mul", [](const Inputs& x) { return mul(x[0], x[1]); }, {normal({3, 4}), normal({4})});
  expect_dtypes_agree("div", [](const Inputs& x) { return div(x[0], x[1]); }, {normal({3, 4}), positive({4})});
  expect_dtypes_agree("scalar", [](const Inputs& x) { return x[0] * 0.5 + 1.0; }, {normal({5})});
  expect_dtypes_agree("exp", [](const Inputs& x) { return exp(x[0]); }, {normal({8})});
  expect_dtypes_agree("log", [](const Inputs& x) { return log(x[0]); }, {positive({8})});
  expect_dtypes_agree("sqrt", [](const Inputs& x) { return sqrt(x[0]); }, {positive({8})});
  expect_dtypes_agree("pow", [](const Inputs& x) { return pow(x[0], 2.0); }, {normal({8})});
  expect_dtypes_agree("gelu", [](const Inputs& x) { return gelu(x[0]); }, {normal({8})});
  expect_dtypes_agree("relu", [](const Inputs& x) { return relu(x[0]); }, {normal({8})});
  expect_dtypes_agree("tanh", [](const Inputs& x) { return tanh(x[0]); }, {normal({8})});
  expect_dtypes_agree("sigmoid", [](const Inputs& x) { return sigmoid(x[0]); }, {normal({8})});
}

TEST_F(OpDtypes, ReductionsAndShapes) {
  expect_dtypes_agree("sum", [](const Inputs& x) { return sum(x[0], 1); }, {normal({3, 4, 2})});
  expect_dtypes_agree("mean", [](const Inputs& x) { return mean(x[0]); }, {normal({3, 4})});
  expect_dtypes_agree("max", [](const Inputs& x) { return max(x[0], -1); }, {normal({3, 4})});
  expect_dtypes_agree("permute", [](const Inputs& x) { return exp(x[0].permute({2, 0, 1})); }, {normal({2, 3, 4})});
  expect_dtypes_agree("concat",
                      [](const Inputs& x) {
                        return concat({x[0], x[1]}, 1);
                      },
                      {normal({2, 3}), normal({2, 1})});
  expect_dtypes_agree("split", [](const Inputs& x) { return split(x[0], {1, 2}, 1)[1]; }, {normal({2, 3})});
  expect_dtypes_agree("slice", [](const Inputs& x) { return slice(x[0], 1, 1, 2); }, {normal({2, 3})});
}

TEST_F(OpDtypes, MatmulSoftmaxAndLosses) {
  expect_dtypes_agree("matmul", [](const Inputs& x) { return matmul(x[0], x[1], false, true); },
                      {normal({2, 3, 16}), normal({5, 16})});
  expect_dtypes_agree("softmax", [](const Inputs& x) { return softmax(x[0]); }, {normal({4, 6})});
  expect_dtypes_agree("log_softmax", [](const Inputs& x) { return log_softmax(x[0]); }, {normal({4, 6})});
  Tensor idx = from_vector(std::vector<int64_t>{0, 2, 2, 1}, {4}, TensorOptions{}.with_dtype(DType::Int64));
  expect_dtypes_agree("embedding", [](const Inputs& x) { return embedding(x[0], x[1]); }, {normal({3, 4}), idx});
  Tensor targets = from_vector(std::vector<int32_t>{0, 5, -100, 3}, {4}, TensorOptions{}.with_dtype(DType::Int32));
  expect_dtypes_agree("cross_entropy", [](const Inputs& x) { return cross_entropy(x[0], x[1]); },
                      {normal({4, 6}), targets});
  expect_dtypes_agree("mse_loss", [](const Inputs& x) { return mse_loss(x[0], x[1]); }, {normal({6}), normal({6})});
}

}  // namespace
}  // namespace dpt
