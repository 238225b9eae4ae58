#pragma once
// Walks the elements of a shape in row-major order while tracking the element offset of each of N
// strided operands (stride 0 on a broadcast dimension). An odometer over all dims but the last, and a
// plain loop over the last, so the common cases stay a simple inner loop.
#include <array>
#include <cstdint>
#include <vector>

#include "core/shape.h"

namespace dpt::cpu {

// body(linear_index, offsets) is called once per element, in row-major order of `shape`.
template <size_t N, class Body>
void for_each_strided(const Shape& shape, const std::array<const Shape*, N>& strides, Body&& body) {
  const int64_t numel = shape_numel(shape);
  if (numel == 0) return;
  const size_t rank = shape.size();
  std::array<int64_t, N> offsets{};
  if (rank == 0) {
    body(int64_t{0}, offsets);
    return;
  }
  const int64_t inner = shape[rank - 1];
  std::array<int64_t, N> inner_stride;
  for (size_t k = 0; k < N; ++k) inner_stride[k] = (*strides[k])[rank - 1];
  std::vector<int64_t> counter(rank, 0);
  for (int64_t linear = 0; linear < numel; linear += inner) {
    std::array<int64_t, N> o = offsets;
    for (int64_t i = 0; i < inner; ++i) {
      body(linear + i, o);
      for (size_t k = 0; k < N; ++k) o[k] += inner_stride[k];
    }
    // Advance the odometer over dims [0, rank - 1).
    for (size_t d = rank - 1; d-- > 0;) {
      if (++counter[d] < shape[d]) {
        for (size_t k = 0; k < N; ++k) offsets[k] += (*strides[k])[d];
        break;
      }
      for (size_t k = 0; k < N; ++k) offsets[k] -= (*strides[k])[d] * (shape[d] - 1);
      counter[d] = 0;
    }
  }
}

}  // namespace dpt::cpu
