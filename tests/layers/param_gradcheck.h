#pragma once
// Finite-difference check of d out / d w for tensors `wrt` that a closure reads in place: module
// parameters (and input leaves the test created). Like core/gradcheck.h, the output is reduced to
// L = sum(out * r) with fixed random r, and each element of each tensor is perturbed by +-h in float64.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "core/autograd.h"
#include "core/factory.h"
#include "core/ops.h"

namespace dpt::testing {

inline void expect_param_gradients_match(const std::function<Tensor()>& f, const NamedTensors& wrt,
                                         double tol = 1e-6) {
  for (const auto& [name, t] : wrt) {
    ASSERT_EQ(t.dtype(), DType::Float64) << name;
    ASSERT_TRUE(t.requires_grad() && t.is_leaf()) << name;
    t.zero_grad(true);
  }
  Tensor out = f();
  ASSERT_TRUE(out.requires_grad());
  Generator gen(4321);
  Tensor r = rand(out.shape(), gen, TensorOptions{}.with_dtype(DType::Float64), 0.5, 1.5);
  sum(mul(out, r)).backward();
  NoGradGuard no_grad;
  auto loss = [&] { return sum(mul(f(), r)).item(); };
  const double h = 1e-6;
  for (const auto& [name, t] : wrt) {
    Tensor g = t.grad();
    std::vector<double> analytic =
        g.defined() ? g.to_vector<double>() : std::vector<double>(static_cast<size_t>(t.numel()), 0.0);
    bool any_nonzero = false;
    for (double a : analytic) any_nonzero = any_nonzero || a != 0.0;
    EXPECT_TRUE(any_nonzero) << name << ": gradient is identically zero, the check would prove nothing";
    double* p = t.data<double>();
    for (int64_t j = 0; j < t.numel(); ++j) {
      const double saved = p[j];
      p[j] = saved + h;
      double plus = loss();
      p[j] = saved - h;
      double minus = loss();
      p[j] = saved;
      double numeric = (plus - minus) / (2 * h);
      EXPECT_NEAR(analytic[static_cast<size_t>(j)], numeric, tol * (1 + std::abs(numeric))) << name << "[" << j << "]";
    }
  }
}

// A float64 CPU leaf that requires grad, filled from N(0, 1).
inline Tensor leaf64(const Shape& shape, Generator& gen) {
  Tensor t = randn(shape, gen, TensorOptions{}.with_dtype(DType::Float64));
  t.requires_grad_(true);
  return t;
}

}  // namespace dpt::testing
