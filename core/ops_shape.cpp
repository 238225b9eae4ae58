// Shape ops. reshape (of contiguous data), transpose, permute, slice and split return views that share
// storage with their input; concat copies. Gradients flow back through the inverse rearrangement.
#include <numeric>

#include "core/autograd.h"
#include "core/error.h"
#include "core/factory.h"
#include "core/kernels.h"
#include "core/op_helpers.h"
#include "core/ops.h"

namespace dpt {

namespace {

Shape resolve_shape(const Shape& requested, int64_t numel, const Shape& from) {
  Shape shape = requested;
  int64_t known = 1, infer = -1;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == -1) {
      DPT_CHECK(infer < 0, "reshape: more than one -1 in {}", shape_str(requested));
      infer = static_cast<int64_t>(d);
    } else {
      DPT_CHECK(shape[d] >= 0, "reshape: negative extent in {}", shape_str(requested));
      known *= shape[d];
    }
  }
  if (infer >= 0) {
    DPT_CHECK(known > 0 && numel % known == 0, "reshape: cannot reshape {} into {}", shape_str(from),
              shape_str(requested));
    shape[infer] = numel / known;
  }
  DPT_CHECK(shape_numel(shape) == numel, "reshape: cannot reshape {} ({} elements) into {} ({} elements)",
            shape_str(from), numel, shape_str(requested), shape_numel(shape));
  return shape;
}

// Gradient of slice(x, dim, start, end): g placed in a zero tensor of the input's shape.
Tensor pad_along(const Tensor& g, const Shape& input_shape, int64_t dim, int64_t start) {
  std::vector<Tensor> parts;
  Shape before = input_shape, after = input_shape;
  before[dim] = start;
  after[dim] = input_shape[dim] - start - g.size(dim);
  if (before[dim] > 0) parts.push_back(zeros(before, g.options()));
  parts.push_back(g);
  if (after[dim] > 0) parts.push_back(zeros(after, g.options()));
  return parts.size() == 1 ? g : detail::concat_data(parts, dim);
}

// A raw view of rows [start, end) along `dim`.
Tensor slice_view(const Tensor& x, int64_t dim, int64_t start, int64_t end) {
  Shape shape = x.shape();
  shape[dim] = end - start;
  return make_view(x, shape, x.strides(), x.impl()->offset + start * x.strides()[dim]);
}

}  // namespace

Tensor reshape(const Tensor& x, const Shape& requested) {
  DPT_CHECK(x.defined(), "reshape: undefined input tensor");
  Shape shape = resolve_shape(requested, x.numel(), x.shape());
  Tensor base = detail::contiguous_data(x.detach());
  Tensor out = make_view(base, shape, contiguous_strides(shape), base.impl()->offset);
  Shape in_shape = x.shape();
  record_op("ReshapeBackward", {x}, {out},
            [in_shape](const std::vector<Tensor>& g) { return std::vector<Tensor>{g[0].reshape(in_shape)}; });
  return out;
}

Tensor permute(const Tensor& x, const std::vector<int64_t>& dims) {
  DPT_CHECK(x.defined(), "permute: undefined input tensor");
  const int64_t rank = x.dim();
  DPT_CHECK(static_cast<int64_t>(dims.size()) == rank, "permute: {} dims given for a tensor of shape {}", dims.size(),
            shape_str(x.shape()));
  std::vector<int64_t> wrapped(dims.size()), inverse(dims.size(), -1);
  Shape shape(dims.size()), strides(dims.size());
  for (size_t i = 0; i < dims.size(); ++i) {
    int64_t d = wrap_dim(dims[i], rank, "permute");
    DPT_CHECK(inverse[d] < 0, "permute: dimension {} repeated in the permutation of {}", d, shape_str(x.shape()));
    inverse[d] = static_cast<int64_t>(i);
    shape[i] = x.shape()[d];
    strides[i] = x.strides()[d];
  }
  Tensor out = make_view(x, shape, strides, x.impl()->offset);
  record_op("PermuteBackward", {x}, {out},
            [inverse](const std::vector<Tensor>& g) { return std::vector<Tensor>{g[0].permute(inverse)}; });
  return out;
}

Tensor transpose(const Tensor& x, int64_t d0, int64_t d1) {
  DPT_CHECK(x.defined(), "transpose: undefined input tensor");
  d0 = wrap_dim(d0, x.dim(), "transpose");
  d1 = wrap_dim(d1, x.dim(), "transpose");
  std::vector<int64_t> dims(static_cast<size_t>(x.dim()));
  std::iota(dims.begin(), dims.end(), 0);
  std::swap(dims[d0], dims[d1]);
  return permute(x, dims);
}

Tensor slice(const Tensor& x, int64_t dim, int64_t start, int64_t end) {
  DPT_CHECK(x.defined(), "slice: undefined input tensor");
  DPT_CHECK(x.dim() >= 1, "slice: cannot slice a 0-d tensor");
  dim = wrap_dim(dim, x.dim(), "slice");
  const int64_t size = x.size(dim);
  if (start < 0) start += size;
  if (end < 0) end += size;
  DPT_CHECK(0 <= start && start <= end && end <= size, "slice: range [{}, {}) out of bounds for dim {} of shape {}",
            start, end, dim, shape_str(x.shape()));
  Tensor out = slice_view(x, dim, start, end);
  Shape in_shape = x.shape();
  record_op("SliceBackward", {x}, {out}, [in_shape, dim, start](const std::vector<Tensor>& g) {
    return std::vector<Tensor>{pad_along(g[0], in_shape, dim, start)};
  });
  return out;
}

Tensor concat(const std::vector<Tensor>& xs, int64_t dim) {
  DPT_CHECK(!xs.empty(), "concat: no tensors given");
  DPT_CHECK(xs[0].defined() && xs[0].dim() >= 1, "concat: expected tensors of rank >= 1");
  dim = wrap_dim(dim, xs[0].dim(), "concat");
  std::vector<int64_t> sizes;
  std::vector<Tensor> data;
  for (const auto& x : xs) {
    detail::check_compatible("concat", xs[0], x);
    bool fits = x.dim() == xs[0].dim();
    for (int64_t d = 0; fits && d < x.dim(); ++d) fits = d == dim || x.size(d) == xs[0].size(d);
    DPT_CHECK(fits, "concat: shapes {} and {} differ outside dim {}", shape_str(xs[0].shape()), shape_str(x.shape()),
              dim);
    sizes.push_back(x.size(dim));
    data.push_back(x.detach());
  }
  Tensor out = detail::concat_data(data, dim);
  record_op("ConcatBackward", xs, {out}, [sizes, dim](const std::vector<Tensor>& g) {
    std::vector<Tensor> grads;
    int64_t start = 0;
    for (int64_t s : sizes) {
      grads.push_back(slice_view(g[0], dim, start, start + s));
      start += s;
    }
    return grads;
  });
  return out;
}

std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t dim) {
  DPT_CHECK(x.defined() && x.dim() >= 1, "split: expected a tensor of rank >= 1");
  dim = wrap_dim(dim, x.dim(), "split");
  int64_t total = 0;
  for (int64_t s : sizes) {
    DPT_CHECK(s >= 0, "split: negative size {}", s);
    total += s;
  }
  DPT_CHECK(total == x.size(dim), "split: sizes sum to {} but dim {} of shape {} has {}", total, dim,
            shape_str(x.shape()), x.size(dim));
  std::vector<Tensor> outs;
  int64_t start = 0;
  for (int64_t s : sizes) {
    outs.push_back(slice_view(x, dim, start, start + s));
    start += s;
  }
  Shape in_shape = x.shape();
  record_op("SplitBackward", {x}, outs, [in_shape, sizes, dim](const std::vector<Tensor>& g) {
    TensorOptions options;
    for (const auto& gi : g) {
      if (gi.defined()) options = gi.options();
    }
    std::vector<Tensor> parts;
    for (size_t i = 0; i < sizes.size(); ++i) {
      if (g[i].defined()) {
        parts.push_back(g[i]);
      } else {
        Shape s = in_shape;
        s[dim] = sizes[i];
        parts.push_back(zeros(s, options));
      }
    }
    return std::vector<Tensor>{detail::concat_data(parts, dim)};
  });
  return outs;
}

}  // namespace dpt
