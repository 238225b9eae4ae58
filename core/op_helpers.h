#pragma once
// Helpers shared by the op implementations (core/ops_*.cpp); not part of the public interface.
// None of these record autograd: they build forward results and backward gradients from kernels.
#include <vector>

#include "core/tensor.h"

namespace dpt::detail {

// A contiguous copy of `x` when it is a strided view, else `x` itself; never recorded by autograd.
Tensor contiguous_data(const Tensor& x);
// A new contiguous tensor of `shape` with x's dtype and device.
Tensor empty_as(const Tensor& x, const Shape& shape);
// Throws naming `op` unless `x` holds a floating dtype.
void check_floating(const char* op, const Tensor& x);
// Throws naming `op` and both operands unless they share dtype and device.
void check_compatible(const char* op, const Tensor& a, const Tensor& b);
// `x` viewed with stride 0 along the dims where it is broadcast to `shape` (NumPy rules).
Tensor broadcast_view(const Tensor& x, const Shape& shape);
// A contiguous copy of `x` broadcast to `shape`.
Tensor expand_copy(const Tensor& x, const Shape& shape);
// Concatenation along `dim` without autograd (inputs already checked).
Tensor concat_data(const std::vector<Tensor>& xs, int64_t dim);

}  // namespace dpt::detail
