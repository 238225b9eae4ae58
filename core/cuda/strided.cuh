#pragma once
// Strided element offsets for kernels whose inputs are arbitrary views (copies, broadcasting binary
// ops) and whose output is contiguous. The shape and strides travel to the kernel by value in a small
// struct. Before launching, dimensions are simplified: size-1 dims are dropped and neighbours that are
// contiguous with each other in every input are merged, so `x[rows, cols] + bias[cols]` becomes a 2-d
// walk and a contiguous copy a 1-d one.
#include <array>
#include <cstdint>

#include "core/error.h"
#include "core/shape.h"

namespace dpt::cuda_kernels {

constexpr int kMaxDims = 8;

template <int N>
struct StridedShape {
  int ndim = 0;
  int64_t sizes[kMaxDims] = {};
  int64_t strides[N][kMaxDims] = {};

  // Offsets (in elements) of output element `linear` in each input. Walks from the innermost dim.
  template <class I>
  __host__ __device__ __forceinline__ void offsets(I linear, int64_t (&out)[N]) const {
    for (int k = 0; k < N; ++k) out[k] = 0;
    for (int d = ndim - 1; d >= 0; --d) {
      const I size = static_cast<I>(sizes[d]);
      const I i = linear % size;
      linear /= size;
      for (int k = 0; k < N; ++k) out[k] += static_cast<int64_t>(i) * strides[k][d];
    }
  }
};

template <int N>
StridedShape<N> make_strided_shape(const Shape& shape, const std::array<const Shape*, N>& strides, const char* what) {
  // Drop size-1 dims (their stride never matters), then merge d into d+1 where every input allows it.
  int64_t sizes[64];
  int64_t st[N][64];
  int nd = 0;
  DPT_CHECK(shape.size() <= 64, "{} (CUDA): rank {} is too large", what, shape.size());
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1) continue;
    sizes[nd] = shape[d];
    for (int k = 0; k < N; ++k) st[k][nd] = (*strides[k])[d];
    ++nd;
  }
  int merged = 0;
  for (int d = 0; d < nd; ++d) {
    if (merged > 0) {
      bool can = true;
      for (int k = 0; k < N; ++k) can = can && st[k][merged - 1] == st[k][d] * sizes[d];
      if (can) {
        sizes[merged - 1] *= sizes[d];
        for (int k = 0; k < N; ++k) st[k][merged - 1] = st[k][d];
        continue;
      }
    }
    sizes[merged] = sizes[d];
    for (int k = 0; k < N; ++k) st[k][merged] = st[k][d];
    ++merged;
  }
  DPT_CHECK(merged <= kMaxDims, "{} (CUDA): a view of shape {} needs {} strided dims after merging, at most {}", what,
            shape_str(shape), merged, kMaxDims);
  StridedShape<N> s;
  s.ndim = merged;
  for (int d = 0; d < merged; ++d) {
    s.sizes[d] = sizes[d];
    for (int k = 0; k < N; ++k) s.strides[k][d] = st[k][d];
  }
  return s;
}

// Whether the innermost dim can move V elements at a time: its size is a multiple of V, and every
// input either walks it contiguously (stride 1, with 16-byte aligned rows: base pointer aligned and
// every outer stride a multiple of V) or broadcasts along it (stride 0).
template <int N>
bool inner_vectorizable(const StridedShape<N>& s, const std::array<const void*, N>& ptrs, int v, int elem_bytes) {
  if (s.ndim == 0 || s.sizes[s.ndim - 1] % v != 0) return false;
  for (int k = 0; k < N; ++k) {
    const int64_t inner = s.strides[k][s.ndim - 1];
    if (inner == 0) continue;
    if (inner != 1 || reinterpret_cast<uintptr_t>(ptrs[k]) % (static_cast<uintptr_t>(v) * elem_bytes) != 0) {
      return false;
    }
    for (int d = 0; d + 1 < s.ndim; ++d) {
      if (s.strides[k][d] % v != 0) return false;
    }
  }
  return true;
}

}  // namespace dpt::cuda_kernels
