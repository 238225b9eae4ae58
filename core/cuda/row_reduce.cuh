#pragma once
// Row-wise reductions shared by softmax and cross-entropy: a row is handled either by one warp (short
// rows: many rows per block, no shared memory, no __syncthreads) or by one block (long rows). The
// "online" max/sum pair lets one pass over a row produce both max(x) and sum(exp(x - max)):
// merging (m1, s1) and (m2, s2) gives m = max(m1, m2), s = s1 exp(m1 - m) + s2 exp(m2 - m).
#include "core/cuda/kernel_utils.cuh"

namespace dpt::cuda_kernels {

template <class C>
__device__ __forceinline__ C fast_exp(C x) {
  if constexpr (std::is_same_v<C, float>)
    return expf(x);
  else
    return exp(x);
}
template <class C>
__device__ __forceinline__ C fast_log(C x) {
  if constexpr (std::is_same_v<C, float>)
    return logf(x);
  else
    return log(x);
}
template <class C>
__device__ __forceinline__ C neg_inf() {
  return -static_cast<C>(INFINITY);
}

// Adds one element to a thread's running (max, sum of exp(x - max)).
template <class C>
__device__ __forceinline__ void online_add(C& m, C& s, C x) {
  if (x > m) {
    s = s * fast_exp(m - x) + C(1);  // exp(-inf) = 0 handles the first element
    m = x;
  } else {
    s += fast_exp(x - m);
  }
}

template <class C>
__device__ __forceinline__ void online_merge(C& m, C& s, C m2, C s2) {
  const C mx = max(m, m2);
  if (mx == neg_inf<C>()) return;  // both empty
  s = (m == neg_inf<C>() ? C(0) : s * fast_exp(m - mx)) + (m2 == neg_inf<C>() ? C(0) : s2 * fast_exp(m2 - mx));
  m = mx;
}

// Where this thread sits in its row, for the two layouts.
template <bool WarpRow>
struct RowSlot {
  int64_t row;
  int tid;       // index within the row's threads
  int nthreads;  // threads per row
  __device__ __forceinline__ RowSlot() {
    if constexpr (WarpRow) {
      row = static_cast<int64_t>(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5);
      tid = threadIdx.x & 31;
      nthreads = 32;
    } else {
      row = blockIdx.x;
      tid = threadIdx.x;
      nthreads = blockDim.x;
    }
  }
};

// Whole-row reductions: every thread of the row gets the result. `scratch` is 32 values of shared
// memory, unused for warp rows.
template <bool WarpRow, class C>
__device__ __forceinline__ C row_sum(C v, C* scratch) {
  if constexpr (WarpRow)
    return warp_sum(v);
  else
    return block_sum(v, scratch);
}

template <bool WarpRow, class C>
__device__ __forceinline__ void row_online(C& m, C& s, C* scratch_m, C* scratch_s) {
  for (int o = 16; o > 0; o >>= 1) {
    C m2 = __shfl_xor_sync(0xffffffffu, m, o), s2 = __shfl_xor_sync(0xffffffffu, s, o);
    online_merge(m, s, m2, s2);
  }
  if constexpr (!WarpRow) {
    if (blockDim.x == 32) return;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    __syncthreads();
    if (lane == 0) {
      scratch_m[warp] = m;
      scratch_s[warp] = s;
    }
    __syncthreads();
    m = lane < warps ? scratch_m[lane] : neg_inf<C>();
    s = lane < warps ? scratch_s[lane] : C(0);
    for (int o = 16; o > 0; o >>= 1) {
      C m2 = __shfl_xor_sync(0xffffffffu, m, o), s2 = __shfl_xor_sync(0xffffffffu, s, o);
      online_merge(m, s, m2, s2);
    }
  }
}

// Rows of at most this many elements go one warp per row.
constexpr int64_t kWarpRowMax = 1024;
constexpr int kWarpRowsPerBlock = 8;

}  // namespace dpt::cuda_kernels
