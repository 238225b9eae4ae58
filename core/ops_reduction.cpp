// Reductions: sum, mean, max and argmax, whole-tensor or along one dim.
// Every reduction views its (contiguous) input as [outer, n, inner] and reduces the middle dim.
#include "core/autograd.h"
#include "core/error.h"
#include "core/factory.h"
#include "core/kernels.h"
#include "core/op_helpers.h"
#include "core/ops.h"

namespace dpt {

namespace {

struct Split3 {
  int64_t outer = 1, n = 1, inner = 1;
  Shape kept;     // the shape with `dim` kept as 1
  Shape dropped;  // the shape with `dim` removed
};

Split3 split_at(const Shape& shape, int64_t dim) {
  Split3 s;
  for (int64_t d = 0; d < static_cast<int64_t>(shape.size()); ++d) {
    if (d < dim) s.outer *= shape[d];
    if (d > dim) s.inner *= shape[d];
    s.kept.push_back(d == dim ? 1 : shape[d]);
    if (d != dim) s.dropped.push_back(shape[d]);
  }
  s.n = shape[dim];
  return s;
}

// Gradient of a sum: the output gradient repeated along the reduced dims.
Tensor sum_backward(const Tensor& g, const Shape& kept, const Shape& input_shape) {
  return detail::expand_copy(g.reshape(kept), input_shape);
}

}  // namespace

Tensor sum(const Tensor& x) {
  DPT_CHECK(x.defined(), "sum: undefined input tensor");
  Tensor in = detail::contiguous_data(x.detach());
  Tensor out = detail::empty_as(x, {});
  kernels::reduce(kernels::ReduceOp::Sum, in, 1, x.numel(), 1, out, Tensor());
  Shape shape = x.shape();
  record_op("SumBackward", {x}, {out}, [shape](const std::vector<Tensor>& g) {
    return std::vector<Tensor>{sum_backward(g[0], Shape(shape.size(), 1), shape)};
  });
  return out;
}

Tensor sum(const Tensor& x, int64_t dim, bool keepdim) {
  DPT_CHECK(x.defined(), "sum: undefined input tensor");
  dim = wrap_dim(dim, x.dim(), "sum");
  if (x.dim() == 0) return sum(x);
  Split3 s = split_at(x.shape(), dim);
  Tensor in = detail::contiguous_data(x.detach());
  Tensor out = detail::empty_as(x, keepdim ? s.kept : s.dropped);
  kernels::reduce(kernels::ReduceOp::Sum, in, s.outer, s.n, s.inner, out, Tensor());
  Shape shape = x.shape();
  record_op("SumBackward", {x}, {out}, [s, shape](const std::vector<Tensor>& g) {
    return std::vector<Tensor>{sum_backward(g[0], s.kept, shape)};
  });
  return out;
}

Tensor mean(const Tensor& x) {
  detail::check_floating("mean", x);
  return mul(sum(x), 1.0 / static_cast<double>(x.numel()));
}

Tensor mean(const Tensor& x, int64_t dim, bool keepdim) {
  detail::check_floating("mean", x);
  int64_t n = x.dim() == 0 ? 1 : x.size(dim);
  return mul(sum(x, dim, keepdim), 1.0 / static_cast<double>(n));
}

namespace {
// Shared by max and argmax: values and first-maximum indices along `dim`.
std::pair<Tensor, Tensor> max_along(const char* op, const Tensor& x, int64_t dim, bool keepdim, Split3* split) {
  DPT_CHECK(x.defined(), "{}: undefined input tensor", op);
  DPT_CHECK(x.dim() >= 1, "{}: expected a tensor of rank >= 1, found shape {}", op, shape_str(x.shape()));
  dim = wrap_dim(dim, x.dim(), op);
  DPT_CHECK(x.size(dim) > 0, "{}: dimension {} of shape {} is empty", op, dim, shape_str(x.shape()));
  Split3 s = split_at(x.shape(), dim);
  Tensor in = detail::contiguous_data(x.detach());
  Shape out_shape = keepdim ? s.kept : s.dropped;
  Tensor values = detail::empty_as(x, out_shape);
  Tensor indices = Tensor::empty(out_shape, x.options().with_dtype(DType::Int64));
  kernels::reduce(kernels::ReduceOp::Max, in, s.outer, s.n, s.inner, values, indices);
  *split = s;
  return {values, indices};
}
}  // namespace

Tensor max(const Tensor& x, int64_t dim, bool keepdim) {
  Split3 s;
  auto [values, indices] = max_along("max", x, dim, keepdim, &s);
  Shape shape = x.shape();
  Tensor saved = indices.detach();
  record_op("MaxBackward", {x}, {values}, [s, shape, saved](const std::vector<Tensor>& g) {
    Tensor grad_in = zeros(shape, g[0].options());
    kernels::max_backward(detail::contiguous_data(g[0]), saved, s.outer, s.n, s.inner, grad_in);
    return std::vector<Tensor>{grad_in};
  });
  return values;
}

Tensor argmax(const Tensor& x, int64_t dim, bool keepdim) {
  Split3 s;
  return max_along("argmax", x, dim, keepdim, &s).second;
}

}  // namespace dpt
