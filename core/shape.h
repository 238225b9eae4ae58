#pragma once
// Shapes and strides are small vectors of extents; strides count elements, not bytes.
#include <cstdint>
#include <string>
#include <vector>

namespace dpt {

using Shape = std::vector<int64_t>;

int64_t shape_numel(const Shape& shape);
Shape contiguous_strides(const Shape& shape);  // row-major
std::string shape_str(const Shape& shape);     // "[2, 3]"
// Wraps a possibly negative dimension index into [0, rank); throws naming `op` when out of range.
int64_t wrap_dim(int64_t dim, int64_t rank, const char* op);
// NumPy broadcasting of two shapes; throws naming `op` and both shapes when they do not broadcast.
Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op);

}  // namespace dpt
