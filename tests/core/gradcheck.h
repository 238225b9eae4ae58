#pragma once
// Finite-difference gradient checking in float64, reusable by every test suite.
//
//   expect_gradients_match([](const std::vector<Tensor>& x) { return matmul(x[0], x[1]); },
//                          {randn({2, 3}, gen, f64), randn({3, 4}, gen, f64)}, 1e-6);
//
// Every floating input (which must be float64 and on the CPU) is made a fresh leaf that requires grad;
// integer inputs (indices, targets) pass through unchanged. A non-scalar output is reduced to the
// scalar L = sum(out * w) with fixed pseudo-random weights w, so every output element matters and
// mistakes cannot cancel. Analytic dL/dx from backward() is compared with the central difference
// (L(x + h) - L(x - h)) / 2h for every element, within tol * (1 + |numeric|).
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <vector>

#include "core/autograd.h"
#include "core/factory.h"
#include "core/ops.h"
#include "core/tensor.h"

namespace dpt {

namespace gradcheck_detail {
inline double weighted_sum(const Tensor& out, const Tensor& weights) {
  if (!weights.defined()) return sum(out).item();
  return sum(mul(out, weights)).item();
}
}  // namespace gradcheck_detail

inline void expect_gradients_match(std::function<Tensor(const std::vector<Tensor>&)> f, std::vector<Tensor> inputs,
                                   double tol = 1e-6) {
  // 1. Fresh float64 leaves (copies, so the caller's tensors are never modified).
  std::vector<Tensor> leaves;
  for (const Tensor& x : inputs) {
    if (is_floating(x.dtype())) {
      ASSERT_EQ(x.dtype(), DType::Float64) << "gradcheck inputs must be float64: " << x.str();
      ASSERT_TRUE(x.device().is_cpu()) << "gradcheck inputs must be on the CPU";
      Tensor leaf = x.detach().clone();
      leaf.requires_grad_(true);
      leaves.push_back(leaf);
    } else {
      leaves.push_back(x);
    }
  }

  // 2. Analytic gradients of L = sum(out * w).
  Tensor out = f(leaves);
  ASSERT_TRUE(out.requires_grad()) << "the function's output does not depend on any input";
  Tensor weights;
  if (out.numel() != 1) {
    Generator gen(1234);
    weights = rand(out.shape(), gen, TensorOptions{}.with_dtype(DType::Float64), 0.5, 1.5);
  }
  Tensor loss = weights.defined() ? sum(mul(out, weights)) : sum(out);
  loss.backward();

  // 3. Central differences, one element at a time.
  const double h = 1e-6;
  NoGradGuard no_grad;
  for (size_t i = 0; i < leaves.size(); ++i) {
    Tensor leaf = leaves[i];
    if (!is_floating(leaf.dtype())) continue;
    Tensor grad = leaf.grad();
    std::vector<double> analytic =
        grad.defined() ? grad.to_vector<double>() : std::vector<double>(static_cast<size_t>(leaf.numel()), 0.0);
    ASSERT_TRUE(!grad.defined() || grad.shape() == leaf.shape())
        << "input " << i << ": gradient shape " << shape_str(grad.shape()) << " vs " << shape_str(leaf.shape());
    double* p = leaf.data<double>();
    for (int64_t j = 0; j < leaf.numel(); ++j) {
      const double saved = p[j];
      p[j] = saved + h;
      double plus = gradcheck_detail::weighted_sum(f(leaves), weights);
      p[j] = saved - h;
      double minus = gradcheck_detail::weighted_sum(f(leaves), weights);
      p[j] = saved;
      double numeric = (plus - minus) / (2 * h);
      EXPECT_NEAR(analytic[static_cast<size_t>(j)], numeric, tol * (1 + std::abs(numeric)))
          << "input " << i << " " << shape_str(leaf.shape()) << ", element " << j;
    }
  }
}

}  // namespace dpt
