// Elementwise CPU kernels: unary maps and broadcasting binary maps.
#include <cmath>

#include "core/cpu/cpu_kernels.h"
#include "core/cpu/dispatch.h"
#include "core/cpu/strided.h"

namespace dpt::cpu {

namespace {

// GELU, tanh form (GPT-2): 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3).
template <class C>
C gelu_value(C x) {
  const C k = static_cast<C>(0.7978845608028654), c = static_cast<C>(0.044715);
  return static_cast<C>(0.5) * x * (1 + std::tanh(k * (x + c * x * x * x)));
}
// d/dx = 0.5 (1 + t) + 0.5 x (1 - t^2) k (1 + 3 c x^2), t = tanh(u).
template <class C>
C gelu_grad(C x) {
  const C k = static_cast<C>(0.7978845608028654), c = static_cast<C>(0.044715);
  C t = std::tanh(k * (x + c * x * x * x));
  return static_cast<C>(0.5) * (1 + t) + static_cast<C>(0.5) * x * (1 - t * t) * k * (1 + 3 * c * x * x);
}

template <class C>
C apply_unary(UnaryOp op, C x, C s) {
  switch (op) {
    case UnaryOp::Neg:
      return -x;
    case UnaryOp::Exp:
      return std::exp(x);
    case UnaryOp::Log:
      return std::log(x);
    case UnaryOp::Sqrt:
      return std::sqrt(x);
    case UnaryOp::Pow:
      return std::pow(x, s);
    case UnaryOp::Relu:
      return x > 0 ? x : C(0);
    case UnaryOp::Gelu:
      return gelu_value(x);
    case UnaryOp::Tanh:
      return std::tanh(x);
    case UnaryOp::Sigmoid:
      return 1 / (1 + std::exp(-x));
    case UnaryOp::Sign:
      return x > 0 ? C(1) : x < 0 ? C(-1) : x;  // x itself keeps 0 and NaN
    case UnaryOp::Abs:
      return std::abs(x);
    case UnaryOp::ReluGrad:
      return x > 0 ? C(1) : C(0);
    case UnaryOp::GeluGrad:
      return gelu_grad(x);
    case UnaryOp::Scale:
      return x * s;
    case UnaryOp::AddScalar:
      return x + s;
  }
  return x;
}

template <class C>
C apply_binary(BinaryOp op, C a, C b) {
  switch (op) {
    case BinaryOp::Add:
      return a + b;
    case BinaryOp::Sub:
      return a - b;
    case BinaryOp::Mul:
      return a * b;
    case BinaryOp::Div:
      return a / b;
  }
  return a;
}

}  // namespace

void unary(UnaryOp op, const Tensor& in, const Tensor& out, double scalar) {
  DPT_CHECK(in.dtype() == out.dtype() && in.shape() == out.shape() && in.is_contiguous() && out.is_contiguous(),
            "unary kernel: expected contiguous in/out of equal shape and dtype, found {} {} and {} {}",
            shape_str(in.shape()), dtype_name(in.dtype()), shape_str(out.shape()), dtype_name(out.dtype()));
  visit_floating(out.dtype(), "unary kernel", [&](auto tag) {
    using T = decltype(tag);
    using C = Compute<T>;
    const T* x = in.data<T>();
    T* y = out.data<T>();
    const C s = static_cast<C>(scalar);
    const int64_t n = out.numel();
    for (int64_t i = 0; i < n; ++i) y[i] = convert<T>(apply_unary<C>(op, convert<C>(x[i]), s));
  });
}

void binary(BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out) {
  DPT_CHECK(a.dtype() == out.dtype() && b.dtype() == out.dtype(), "binary kernel: dtypes {} and {} into {}",
            dtype_name(a.dtype()), dtype_name(b.dtype()), dtype_name(out.dtype()));
  DPT_CHECK(a.shape() == out.shape() && b.shape() == out.shape() && out.is_contiguous(),
            "binary kernel: operands {} and {} must be views broadcast to the contiguous output {}",
            shape_str(a.shape()), shape_str(b.shape()), shape_str(out.shape()));
  visit_all(out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    using C = std::conditional_t<std::is_integral_v<T>, T, Compute<T>>;
    const T* pa = a.data<T>();
    const T* pb = b.data<T>();
    T* po = out.data<T>();
    if (a.is_contiguous() && b.is_contiguous()) {
      const int64_t n = out.numel();
      for (int64_t i = 0; i < n; ++i) po[i] = convert<T>(apply_binary<C>(op, convert<C>(pa[i]), convert<C>(pb[i])));
      return;
    }
    for_each_strided<2>(out.shape(), {&a.strides(), &b.strides()}, [&](int64_t i, const std::array<int64_t, 2>& o) {
      po[i] = convert<T>(apply_binary<C>(op, convert<C>(pa[o[0]]), convert<C>(pb[o[1]])));
    });
  });
}

void where(const Tensor& cond, const Tensor& a, const Tensor& b, const Tensor& out) {
  DPT_CHECK(cond.dtype() == out.dtype() && a.dtype() == out.dtype() && b.dtype() == out.dtype(),
            "where kernel: dtypes {}, {} and {} into {}", dtype_name(cond.dtype()), dtype_name(a.dtype()),
            dtype_name(b.dtype()), dtype_name(out.dtype()));
  DPT_CHECK(cond.shape() == out.shape() && a.shape() == out.shape() && b.shape() == out.shape() && out.is_contiguous(),
            "where kernel: operands {}, {} and {} must be views broadcast to the contiguous output {}",
            shape_str(cond.shape()), shape_str(a.shape()), shape_str(b.shape()), shape_str(out.shape()));
  visit_all(out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* pc = cond.data<T>();
    const T* pa = a.data<T>();
    const T* pb = b.data<T>();
    T* po = out.data<T>();
    for_each_strided<3>(out.shape(), {&cond.strides(), &a.strides(), &b.strides()},
                        [&](int64_t i, const std::array<int64_t, 3>& o) {
                          po[i] = convert<float>(pc[o[0]]) != 0.0f ? pa[o[1]] : pb[o[2]];
                        });
  });
}

}  // namespace dpt::cpu
