// Elementwise ops with NumPy broadcasting, and their gradients.
// Binary ops read their operands through stride-0 views (no broadcast copies); the gradient of an
// operand that was broadcast is summed back to its shape (sum_to_shape).
#include "core/autograd.h"
#include "core/error.h"
#include "core/factory.h"
#include "core/kernels.h"
#include "core/op_helpers.h"
#include "core/ops.h"

namespace dpt {

using kernels::BinaryOp;
using kernels::UnaryOp;

namespace {

Tensor binary_forward(const char* op, BinaryOp kind, const Tensor& a, const Tensor& b) {
  detail::check_compatible(op, a, b);
  Shape shape = broadcast_shapes(a.shape(), b.shape(), op);
  Tensor out = detail::empty_as(a, shape);
  kernels::binary(kind, detail::broadcast_view(a.detach(), shape), detail::broadcast_view(b.detach(), shape), out);
  return out;
}

Tensor unary_forward(const char* op, UnaryOp kind, const Tensor& x, double scalar = 0) {
  detail::check_floating(op, x);
  Tensor in = detail::contiguous_data(x.detach());
  Tensor out = detail::empty_as(x, x.shape());
  kernels::unary(kind, in, out, scalar);
  return out;
}

// The raw unary kernel on a (possibly strided) gradient, for use inside backward functions.
Tensor unary_raw(UnaryOp kind, const Tensor& x, double scalar = 0) {
  return unary_forward("backward", kind, x, scalar);
}

// where's select without autograd: cond converted to a's dtype first. A floating cond goes through
// sign() in its own dtype, so a tiny nonzero (1e-300 in float64) cannot round to 0 in a narrower one.
Tensor where_raw(const Tensor& cond, const Tensor& a, const Tensor& b) {
  detail::check_compatible("where", a, b);
  DPT_CHECK(cond.device() == a.device(), "where: condition on {} but values on {}", cond.device().str(),
            a.device().str());
  Shape shape = broadcast_shapes(broadcast_shapes(cond.shape(), a.shape(), "where"), b.shape(), "where");
  Tensor c = cond.detach();
  if (c.dtype() != a.dtype()) {
    if (is_floating(c.dtype())) c = unary_forward("where", UnaryOp::Sign, c);
    c = c.to(a.dtype());
  }
  Tensor out = detail::empty_as(a, shape);
  kernels::where(detail::broadcast_view(c, shape), detail::broadcast_view(a.detach(), shape),
                 detail::broadcast_view(b.detach(), shape), out);
  return out;
}

}  // namespace

Tensor add(const Tensor& a, const Tensor& b) {
  Tensor out = binary_forward("add", BinaryOp::Add, a, b);
  Shape sa = a.shape(), sb = b.shape();
  record_op("AddBackward", {a, b}, {out}, [sa, sb](const std::vector<Tensor>& g) {
    return std::vector<Tensor>{sum_to_shape(g[0], sa), sum_to_shape(g[0], sb)};
  });
  return out;
}

Tensor sub(const Tensor& a, const Tensor& b) {
  Tensor out = binary_forward("sub", BinaryOp::Sub, a, b);
  Shape sa = a.shape(), sb = b.shape();
  record_op("SubBackward", {a, b}, {out}, [sa, sb](const std::vector<Tensor>& g) {
    return std::vector<Tensor>{sum_to_shape(g[0], sa), sum_to_shape(neg(g[0]), sb)};
  });
  return out;
}

Tensor mul(const Tensor& a, const Tensor& b) {
  Tensor out = binary_forward("mul", BinaryOp::Mul, a, b);
  bool need_a = a.requires_grad(), need_b = b.requires_grad();
  Tensor sa = a.detach(), sb = b.detach();
  record_op("MulBackward", {a, b}, {out}, [sa, sb, need_a, need_b](const std::vector<Tensor>& g) {
    return std::vector<Tensor>{need_a ? sum_to_shape(mul(g[0], sb), sa.shape()) : Tensor(),
                               need_b ? sum_to_shape(mul(g[0], sa), sb.shape()) : Tensor()};
  });
  return out;
}

Tensor div(const Tensor& a, const Tensor& b) {
  Tensor out = binary_forward("div", BinaryOp::Div, a, b);
  bool need_a = a.requires_grad(), need_b = b.requires_grad();
  Tensor sa = a.detach(), sb = b.detach(), so = out.detach();
  record_op("DivBackward", {a, b}, {out}, [sa, sb, so, need_a, need_b](const std::vector<Tensor>& g) {
    // d(a/b)/da = 1/b; d(a/b)/db = -a/b^2 = -out/b.
    return std::vector<Tensor>{need_a ? sum_to_shape(div(g[0], sb), sa.shape()) : Tensor(),
                               need_b ? sum_to_shape(neg(div(mul(g[0], so), sb)), sb.shape()) : Tensor()};
  });
  return out;
}

Tensor add(const Tensor& a, double b) {
  Tensor out = unary_forward("add", UnaryOp::AddScalar, a, b);
  record_op("AddScalarBackward", {a}, {out}, [](const std::vector<Tensor>& g) { return std::vector<Tensor>{g[0]}; });
  return out;
}

Tensor mul(const Tensor& a, double b) {
  Tensor out = unary_forward("mul", UnaryOp::Scale, a, b);
  record_op("MulScalarBackward", {a}, {out},
            [b](const std::vector<Tensor>& g) { return std::vector<Tensor>{unary_raw(UnaryOp::Scale, g[0], b)}; });
  return out;
}

Tensor neg(const Tensor& x) {
  Tensor out = unary_forward("neg", UnaryOp::Neg, x);
  record_op("NegBackward", {x}, {out},
            [](const std::vector<Tensor>& g) { return std::vector<Tensor>{unary_raw(UnaryOp::Neg, g[0])}; });
  return out;
}

Tensor exp(const Tensor& x) {
  Tensor out = unary_forward("exp", UnaryOp::Exp, x);
  Tensor so = out.detach();
  record_op("ExpBackward", {x}, {out},
            [so](const std::vector<Tensor>& g) { return std::vector<Tensor>{mul(g[0], so)}; });
  return out;
}

Tensor log(const Tensor& x) {
  Tensor out = unary_forward("log", UnaryOp::Log, x);
  Tensor sx = x.detach();
  record_op("LogBackward", {x}, {out},
            [sx](const std::vector<Tensor>& g) { return std::vector<Tensor>{div(g[0], sx)}; });
  return out;
}

Tensor sqrt(const Tensor& x) {
  Tensor out = unary_forward("sqrt", UnaryOp::Sqrt, x);
  Tensor so = out.detach();
  record_op("SqrtBackward", {x}, {out}, [so](const std::vector<Tensor>& g) {
    return std::vector<Tensor>{mul(div(g[0], so), 0.5)};  // d sqrt(x) = 1 / (2 sqrt(x))
  });
  return out;
}

Tensor pow(const Tensor& x, double exponent) {
  Tensor out = unary_forward("pow", UnaryOp::Pow, x, exponent);
  Tensor sx = x.detach();
  record_op("PowBackward", {x}, {out}, [sx, exponent](const std::vector<Tensor>& g) {
    if (exponent == 0) return std::vector<Tensor>{zeros_like(sx)};
    // p * x^(p-1), computed directly so x = 0 with p >= 1 stays finite.
    return std::vector<Tensor>{mul(g[0], mul(unary_raw(UnaryOp::Pow, sx, exponent - 1), exponent))};
  });
  return out;
}

Tensor relu(const Tensor& x) {
  Tensor out = unary_forward("relu", UnaryOp::Relu, x);
  Tensor sx = x.detach();
  record_op("ReluBackward", {x}, {out}, [sx](const std::vector<Tensor>& g) {
    return std::vector<Tensor>{mul(g[0], unary_raw(UnaryOp::ReluGrad, sx))};
  });
  return out;
}

namespace {

void check_dropout(const Tensor& x, double p, const char* what) {
  DPT_CHECK(p >= 0 && p < 1, "{}: p must be in [0, 1), got {}", what, p);
  DPT_CHECK(is_floating(x.dtype()), "{}: expected a floating tensor, got {}", what, dtype_name(x.dtype()));
}

// The mask of `rng` applied to a gradient: the backward of both dropout ops.
Tensor dropout_grad(const Tensor& g, double p, const PhiloxArgs& rng) {
  Tensor gy = g.contiguous();
  Tensor gx = Tensor::empty(gy.shape(), gy.options());
  kernels::dropout(gy, gx, p, rng, Tensor());
  return gx;
}

}  // namespace

Tensor dropout(const Tensor& x_in, double p, Generator& gen) {
  check_dropout(x_in, p, "dropout");
  Tensor x = x_in.contiguous();
  Tensor out = Tensor::empty(x.shape(), x.options());
  const PhiloxArgs rng = gen.draw(static_cast<uint64_t>(x.numel()));
  kernels::dropout(x, out, p, rng, Tensor());
  record_op("DropoutBackward", {x_in}, {out}, [p, rng](const std::vector<Tensor>& g) {
    return std::vector<Tensor>{dropout_grad(g[0], p, rng)};
  });
  return out;
}

Tensor dropout_add(const Tensor& x_in, const Tensor& residual_in, double p, Generator& gen) {
  check_dropout(x_in, p, "dropout_add");
  DPT_CHECK(x_in.shape() == residual_in.shape() && x_in.dtype() == residual_in.dtype() &&
                x_in.device() == residual_in.device(),
            "dropout_add: x is {} {} and the residual {} {}: expected one shape, dtype and device",
            shape_str(x_in.shape()), dtype_name(x_in.dtype()), shape_str(residual_in.shape()),
            dtype_name(residual_in.dtype()));
  Tensor x = x_in.contiguous(), residual = residual_in.contiguous();
  Tensor out = Tensor::empty(x.shape(), x.options());
  const PhiloxArgs rng = gen.draw(static_cast<uint64_t>(x.numel()));
  kernels::dropout(x, out, p, rng, residual);
  record_op("DropoutAddBackward", {x_in, residual_in}, {out}, [p, rng](const std::vector<Tensor>& g) {
    return std::vector<Tensor>{dropout_grad(g[0], p, rng), g[0]};
  });
  return out;
}

Tensor gelu(const Tensor& x) {
  Tensor out = unary_forward("gelu", UnaryOp::Gelu, x);
  Tensor sx = x.detach();
  record_op("GeluBackward", {x}, {out}, [sx](const std::vector<Tensor>& g) {
    return std::vector<Tensor>{mul(g[0], unary_raw(UnaryOp::GeluGrad, sx))};
  });
  return out;
}

Tensor tanh(const Tensor& x) {
  Tensor out = unary_forward("tanh", UnaryOp::Tanh, x);
  Tensor so = out.detach();
  record_op("TanhBackward", {x}, {out}, [so](const std::vector<Tensor>& g) {
    // 1 - tanh^2
    Tensor d = unary_raw(UnaryOp::AddScalar, unary_raw(UnaryOp::Neg, mul(so, so)), 1.0);
    return std::vector<Tensor>{mul(g[0], d)};
  });
  return out;
}

Tensor sigmoid(const Tensor& x) {
  Tensor out = unary_forward("sigmoid", UnaryOp::Sigmoid, x);
  Tensor so = out.detach();
  record_op("SigmoidBackward", {x}, {out}, [so](const std::vector<Tensor>& g) {
    // s (1 - s)
    Tensor d = mul(so, unary_raw(UnaryOp::AddScalar, unary_raw(UnaryOp::Neg, so), 1.0));
    return std::vector<Tensor>{mul(g[0], d)};
  });
  return out;
}

Tensor sign(const Tensor& x) {
  Tensor out = unary_forward("sign", UnaryOp::Sign, x);
  Tensor sx = x.detach();
  record_op("SignBackward", {x}, {out},
            [sx](const std::vector<Tensor>&) { return std::vector<Tensor>{zeros_like(sx)}; });
  return out;
}

Tensor abs(const Tensor& x) {
  Tensor out = unary_forward("abs", UnaryOp::Abs, x);
  Tensor sx = x.detach();
  record_op("AbsBackward", {x}, {out}, [sx](const std::vector<Tensor>& g) {
    return std::vector<Tensor>{mul(g[0], unary_raw(UnaryOp::Sign, sx))};
  });
  return out;
}

Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b) {
  Tensor out = where_raw(cond, a, b);
  bool need_a = a.requires_grad(), need_b = b.requires_grad();
  Shape sa = a.shape(), sb = b.shape();
  Tensor c = cond.detach();
  record_op("WhereBackward", {a, b}, {out}, [c, sa, sb, need_a, need_b](const std::vector<Tensor>& g) {
    Tensor zero = zeros({}, g[0].options());
    return std::vector<Tensor>{need_a ? sum_to_shape(where_raw(c, g[0], zero), sa) : Tensor(),
                               need_b ? sum_to_shape(where_raw(c, zero, g[0]), sb) : Tensor()};
  });
  return out;
}

Tensor lerp(const Tensor& a, const Tensor& b, double weight) {
  // Two forms, each exact at its own end: a + w (b - a) gives a at w = 0, b - (1 - w) (b - a) gives b at 1.
  if (weight < 0.5) return add(a, mul(sub(b, a), weight));
  return sub(b, mul(sub(b, a), 1.0 - weight));
}

Tensor lerp(const Tensor& a, const Tensor& b, const Tensor& weight) { return add(a, mul(weight, sub(b, a))); }

}  // namespace dpt
