// Building blocks shared by the ops: contiguous copies, broadcasting views and raw concatenation.
#include "core/error.h"
#include "core/kernels.h"
#include "core/op_helpers.h"

namespace dpt::detail {

Tensor contiguous_data(const Tensor& x) {
  if (x.is_contiguous()) return x;
  Tensor out = Tensor::empty(x.shape(), x.options());
  kernels::copy_strided(x, out);
  return out;
}

Tensor empty_as(const Tensor& x, const Shape& shape) { return Tensor::empty(shape, x.options()); }

void check_floating(const char* op, const Tensor& x) {
  DPT_CHECK(x.defined(), "{}: undefined input tensor", op);
  DPT_CHECK(is_floating(x.dtype()), "{}: expected a floating tensor, found {} of shape {}", op, dtype_name(x.dtype()),
            shape_str(x.shape()));
}

void check_compatible(const char* op, const Tensor& a, const Tensor& b) {
  DPT_CHECK(a.defined() && b.defined(), "{}: undefined input tensor", op);
  DPT_CHECK(a.dtype() == b.dtype() && a.device() == b.device(),
            "{}: operands must share dtype and device, found {} {} on {} and {} {} on {}", op, shape_str(a.shape()),
            dtype_name(a.dtype()), a.device().str(), shape_str(b.shape()), dtype_name(b.dtype()), b.device().str());
}

Tensor broadcast_view(const Tensor& x, const Shape& shape) {
  if (x.shape() == shape) return x;
  const size_t rank = shape.size(), lead = rank - x.shape().size();
  Shape strides(rank, 0);
  for (size_t d = lead; d < rank; ++d) {
    int64_t extent = x.shape()[d - lead];
    DPT_CHECK(extent == shape[d] || extent == 1, "broadcast: shape {} does not broadcast to {}", shape_str(x.shape()),
              shape_str(shape));
    strides[d] = extent == 1 && shape[d] != 1 ? 0 : x.strides()[d - lead];
  }
  return make_view(x, shape, strides, x.impl()->offset);
}

Tensor expand_copy(const Tensor& x, const Shape& shape) {
  Tensor out = empty_as(x, shape);
  kernels::copy_strided(broadcast_view(x, shape), out);
  return out;
}

Tensor concat_data(const std::vector<Tensor>& xs, int64_t dim) {
  Shape shape = xs[0].shape();
  int64_t total = 0;
  for (const auto& x : xs) total += x.size(dim);
  shape[dim] = total;
  Tensor out = empty_as(xs[0], shape);
  int64_t outer = 1;
  for (int64_t d = 0; d < dim; ++d) outer *= shape[d];
  if (outer == 1) {
    // Each input fills one contiguous block of the output.
    int64_t offset = 0;
    for (const auto& x : xs) {
      kernels::copy_strided(x, make_view(out, x.shape(), contiguous_strides(x.shape()), offset));
      offset += x.numel();
    }
    return out;
  }
  bool equal_parts = true;
  for (const auto& x : xs) equal_parts = equal_parts && x.shape() == xs[0].shape();
  if (equal_parts) {
    // Parts of one shape (split's backward for fused q/k/v): stack them into [P, parts shape] (plain
    // block copies), then read the stack as out's shape with `dim` split into (P, size). That view keeps
    // the parts' innermost stride 1, so the final copy moves 16-byte vectors; moving `dim` to the front
    // (below) would leave a unit stride only on dim 0 and an element-at-a-time copy both ways.
    const Shape& part = xs[0].shape();
    const int64_t part_numel = xs[0].numel();
    Shape stack_shape{static_cast<int64_t>(xs.size())};
    stack_shape.insert(stack_shape.end(), part.begin(), part.end());
    Tensor stack = empty_as(xs[0], stack_shape);
    for (size_t i = 0; i < xs.size(); ++i) {
      kernels::copy_strided(xs[i],
                            make_view(stack, part, contiguous_strides(part), static_cast<int64_t>(i) * part_numel));
    }
    const Shape part_strides = contiguous_strides(part);
    Shape split_shape, split_strides;
    for (size_t d = 0; d < part.size(); ++d) {
      if (static_cast<int64_t>(d) == dim) {
        split_shape.push_back(static_cast<int64_t>(xs.size()));
        split_strides.push_back(part_numel);
      }
      split_shape.push_back(part[d]);
      split_strides.push_back(part_strides[d]);
    }
    kernels::copy_strided(make_view(stack, split_shape, split_strides, 0),
                          make_view(out, split_shape, contiguous_strides(split_shape), 0));
    return out;
  }
  // Otherwise concatenate along the first dim of each input viewed with `dim` moved to the front
  // (contiguous blocks again), then copy that back to the requested layout.
  auto to_front = [dim](const Shape& s) {
    Shape r{s[dim]};
    for (size_t d = 0; d < s.size(); ++d) {
      if (static_cast<int64_t>(d) != dim) r.push_back(s[d]);
    }
    return r;
  };
  Shape front_shape = to_front(shape);
  Tensor front = empty_as(xs[0], front_shape);
  int64_t offset = 0;
  for (const auto& x : xs) {
    Tensor moved = make_view(x, to_front(x.shape()), to_front(x.strides()), x.impl()->offset);
    kernels::copy_strided(moved, make_view(front, moved.shape(), contiguous_strides(moved.shape()), offset));
    offset += x.numel();
  }
  // front [total, rest...] -> out: view `front` with `dim` put back in place.
  Shape back_strides(shape.size());
  Shape fs = contiguous_strides(front_shape);
  for (size_t d = 0, r = 1; d < shape.size(); ++d) back_strides[d] = static_cast<int64_t>(d) == dim ? fs[0] : fs[r++];
  kernels::copy_strided(make_view(front, shape, back_strides, 0), out);
  return out;
}

}  // namespace dpt::detail
