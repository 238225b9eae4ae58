// Fused LayerNorm (see core/ops_norm.h for the math).
//
// Fast path (the row fits in registers: n a multiple of the 16-byte vector width V and at most
// 32 * 8 vectors, 16-byte aligned rows, weights of the input dtype or float32): one warp per row. Lane l
// holds vectors l, l + 32, ... of the row (K of them, a compile-time count), so x is read from memory
// exactly once; the mean, the squared deviations and, in backward, the two row means that gx needs are
// warp-shuffle sums with no shared memory and no __syncthreads.
//
// Backward fast path: block b's warps walk rows b * W + warp, stepping by gridDim.x * W. Each lane owns
// the same columns in every row, so it accumulates gy * xhat and gy for them: in registers for rows of up
// to 768 bf16 features, in its own words of shared memory for wider ones (shared_sums_for). The block's
// warps then add their sums in a fixed tree and the block writes one partial row of gw/gb. The grid size
// depends only on the row count and width, so the order of every addition is fixed.
//
// Fallback (any n, any weight dtype): one block per row in forward; in backward block b owns
// kRowsPerChunk consecutive rows and accumulates into its own partial row (thread t owns columns
// t, t + blockDim, ...). Both backward paths finish with column_sum_kernel, which sums the partial rows
// of each column in a fixed order. No atomics: the result is the same bits every run.
//
// Statistics in float (double for float64 input), so bf16 rows are normalised with float32 accuracy.
#include <algorithm>

#include "core/cuda/kernel_utils.cuh"
#include "core/norm_kernels.h"

namespace dpt::cuda_kernels {

namespace {

constexpr int kRowsPerChunk = 32;
constexpr int kWarpsPerBlock = 8;   // rows in flight per block on the fast path
constexpr int kMaxVecsPerLane = 8;  // fast path: n <= 32 * 8 * V
// Backward fast path: the rows each warp walks, and the cap on blocks (partial rows of gw/gb), with the
// column sums in registers (kBwd...) and in shared memory (kShared...).
constexpr int64_t kBwdRowsPerWarp = 4;
constexpr int64_t kBwdMaxBlocks = 1024;
constexpr int64_t kSharedRowsPerWarp = 2;
constexpr int64_t kSharedMaxBlocks = 512;

// Backward's fast path keeps a lane's column sums in shared memory once they would be 32 floats or more
// (1,024 bf16 features and up): beside the row, in registers, they left an SM one block of 8 warps.
constexpr bool shared_sums_for(int vectors_per_lane, int vector_width) { return vectors_per_lane * vector_width >= 32; }

// Statistics dtype of the op (core/ops_norm.cpp): float64 rows keep float64 statistics, others float32.
template <class T>
using Stats = std::conditional_t<std::is_same_v<T, double>, double, float>;

// ---- fast path: one warp per row, the row in registers ---------------------------------------------

template <class T, class W, class S, int K>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    layer_norm_forward_warp_kernel(const T* __restrict__ x, const W* __restrict__ w, const W* __restrict__ b,
                                   T* __restrict__ y, S* __restrict__ mean, S* __restrict__ rstd, int64_t rows, int n,
                                   double eps) {
  constexpr int V = vec_width<T>();
  using C = S;
  const int lane = threadIdx.x & 31;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  if (row >= rows) return;  // the whole warp leaves together, so the shuffles below stay full-warp
  const int nvec = n / V;
  const auto* xv = reinterpret_cast<const Vec<T, V>*>(x + row * n);
  C v[K][V];
  C sum = 0;
#pragma unroll
  for (int k = 0; k < K; ++k) {
    const int j = lane + 32 * k;
    if (j < nvec) {
      const Vec<T, V> t = xv[j];
#pragma unroll
      for (int q = 0; q < V; ++q) {
        v[k][q] = convert<C>(t.v[q]);
        sum += v[k][q];
      }
    } else {
#pragma unroll
      for (int q = 0; q < V; ++q) v[k][q] = 0;
    }
  }
  const C mu = warp_sum(sum) / static_cast<C>(n);
  C sq = 0;
#pragma unroll
  for (int k = 0; k < K; ++k) {
    if (lane + 32 * k < nvec) {
#pragma unroll
      for (int q = 0; q < V; ++q) {
        const C d = v[k][q] - mu;
        sq += d * d;
      }
    }
  }
  const C rs = C(1) / sqrt(warp_sum(sq) / static_cast<C>(n) + static_cast<C>(eps));
  if (lane == 0) {
    mean[row] = mu;
    rstd[row] = rs;
  }
  const auto* wv = reinterpret_cast<const Vec<W, V>*>(w);
  const auto* bv = reinterpret_cast<const Vec<W, V>*>(b);
  auto* yv = reinterpret_cast<Vec<T, V>*>(y + row * n);
#pragma unroll
  for (int k = 0; k < K; ++k) {
    const int j = lane + 32 * k;
    if (j < nvec) {
      const Vec<W, V> wj = wv[j], bj = bv[j];
      Vec<T, V> out;
#pragma unroll
      for (int q = 0; q < V; ++q) {
        out.v[q] = convert<T>((v[k][q] - mu) * rs * convert<C>(wj.v[q]) + convert<C>(bj.v[q]));
      }
      yv[j] = out;
    }
  }
}

// One row of the backward fast path: writes the row's gx and hands sum(i, gy, xhat) each of the lane's
// columns (i = k * V + q, its index among the lane's K * V columns).
template <class T, class W, class S, int K, bool Add, class Sum>
__device__ __forceinline__ void layer_norm_backward_row(const T* __restrict__ gy, const T* __restrict__ x,
                                                        const W* __restrict__ w, const S* __restrict__ mean,
                                                        const S* __restrict__ rstd, T* __restrict__ gx,
                                                        const T* __restrict__ ga, int64_t row, int n, Sum&& sum) {
  constexpr int V = vec_width<T>();
  using C = S;
  const int lane = threadIdx.x & 31;
  const int nvec = n / V;
  const auto* wv = reinterpret_cast<const Vec<W, V>*>(w);
  const auto* xv = reinterpret_cast<const Vec<T, V>*>(x + row * n);
  const auto* gv = reinterpret_cast<const Vec<T, V>*>(gy + row * n);
  const C mu = mean[row], rs = rstd[row];
  C xhat[K][V], dy[K][V];
  C sum_g = 0, sum_gx = 0;
#pragma unroll
  for (int k = 0; k < K; ++k) {
    const int j = lane + 32 * k;
    if (j < nvec) {
      const Vec<T, V> xt = xv[j], gt = gv[j];
      const Vec<W, V> wt = wv[j];
#pragma unroll
      for (int q = 0; q < V; ++q) {
        xhat[k][q] = (convert<C>(xt.v[q]) - mu) * rs;
        dy[k][q] = convert<C>(gt.v[q]);
        const C g = dy[k][q] * convert<C>(wt.v[q]);
        sum_g += g;
        sum_gx += g * xhat[k][q];
      }
    } else {
#pragma unroll
      for (int q = 0; q < V; ++q) xhat[k][q] = dy[k][q] = 0;
    }
  }
  const C mean_g = warp_sum(sum_g) / static_cast<C>(n);
  const C mean_gx = warp_sum(sum_gx) / static_cast<C>(n);
  auto* gxv = reinterpret_cast<Vec<T, V>*>(gx + row * n);
  const Vec<T, V>* gav = nullptr;
  if constexpr (Add) gav = reinterpret_cast<const Vec<T, V>*>(ga + row * n);
#pragma unroll
  for (int k = 0; k < K; ++k) {
    const int j = lane + 32 * k;
    if (j < nvec) {
      const Vec<W, V> wt = wv[j];  // re-read from L1 rather than held in registers across the shuffles
      Vec<T, V> add;
      if constexpr (Add) add = gav[j];
      Vec<T, V> out;
#pragma unroll
      for (int q = 0; q < V; ++q) {
        C v = rs * (dy[k][q] * convert<C>(wt.v[q]) - mean_g - xhat[k][q] * mean_gx);
        if constexpr (Add) v += convert<C>(add.v[q]);
        out.v[q] = convert<T>(v);
        sum(k * V + q, dy[k][q], xhat[k][q]);
      }
      gxv[j] = out;
    }
  }
}

// The last step of both backward kernels, in warp 0: the block's sums of each lane's columns (sum_w(i) and
// sum_b(i) for its i-th, i = k * V + q) written as partial row blockIdx.x of gw and gb.
template <int K, int V, class S, class SumW, class SumB>
__device__ __forceinline__ void write_partial_row(S* __restrict__ partial_gw, S* __restrict__ partial_gb, int n,
                                                  SumW&& sum_w, SumB&& sum_b) {
  const int lane = threadIdx.x & 31;
  S* pgw = partial_gw + static_cast<int64_t>(blockIdx.x) * n;
  S* pgb = partial_gb + static_cast<int64_t>(blockIdx.x) * n;
#pragma unroll
  for (int k = 0; k < K; ++k) {
    const int j = lane + 32 * k;
    if (j < n / V) {
#pragma unroll
      for (int q = 0; q < V; ++q) {
        pgw[j * V + q] = sum_w(k * V + q);
        pgb[j * V + q] = sum_b(k * V + q);
      }
    }
  }
}

// ga (the skip connection's gradient, added to gx) is read only when Add.
template <class T, class W, class S, int K, bool Add>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    layer_norm_backward_warp_kernel(const T* __restrict__ gy, const T* __restrict__ x, const W* __restrict__ w,
                                    const S* __restrict__ mean, const S* __restrict__ rstd, T* __restrict__ gx,
                                    const T* __restrict__ ga, S* __restrict__ partial_gw, S* __restrict__ partial_gb,
                                    int64_t rows, int n) {
  constexpr int V = vec_width<T>();
  using C = S;
  extern __shared__ unsigned char ln_smem[];  // ln_backward_smem_bytes<S, K, V>(): the reduction below
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  C acc_w[K][V], acc_b[K][V];
#pragma unroll
  for (int k = 0; k < K; ++k) {
#pragma unroll
    for (int q = 0; q < V; ++q) acc_w[k][q] = acc_b[k][q] = 0;
  }
  const int64_t step = static_cast<int64_t>(gridDim.x) * kWarpsPerBlock;
  // Warps without rows fall through with zero sums: every warp must reach the __syncthreads below.
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + warp; row < rows; row += step) {
    layer_norm_backward_row<T, W, S, K, Add>(gy, x, w, mean, rstd, gx, ga, row, n, [&](int i, C dy, C xhat) {
      acc_w[i / V][i % V] += dy * xhat;
      acc_b[i / V][i % V] += dy;
    });
  }
  // The block's column sums: a fixed pairwise tree over its warps (warp w adds warp w + half, for half =
  // 4, 2, 1), so the order of the additions, and the bits of the result, never change. Warp w's values
  // go through shared memory as [pair][sum][k][q][lane]: the 32 lanes of every access touch 32
  // consecutive words, free of bank conflicts (indexing by column, each lane's 8 consecutive columns
  // made 8-way conflicts), and 3 rounds replace the former 8 one-warp-at-a-time turns.
  constexpr int kSlot = K * V * 32;
  S* red = reinterpret_cast<S*>(ln_smem);
#pragma unroll
  for (int half = kWarpsPerBlock / 2; half >= 1; half /= 2) {
    if (warp >= half && warp < 2 * half) {
      S* dst = red + (warp - half) * 2 * kSlot;
#pragma unroll
      for (int k = 0; k < K; ++k) {
#pragma unroll
        for (int q = 0; q < V; ++q) {
          dst[(k * V + q) * 32 + lane] = acc_w[k][q];
          dst[kSlot + (k * V + q) * 32 + lane] = acc_b[k][q];
        }
      }
    }
    __syncthreads();
    if (warp < half) {
      const S* src = red + warp * 2 * kSlot;
#pragma unroll
      for (int k = 0; k < K; ++k) {
#pragma unroll
        for (int q = 0; q < V; ++q) {
          acc_w[k][q] += src[(k * V + q) * 32 + lane];
          acc_b[k][q] += src[kSlot + (k * V + q) * 32 + lane];
        }
      }
    }
    __syncthreads();  // the next round's writers reuse these slots
  }
  if (warp == 0) {
    write_partial_row<K, V>(
        partial_gw, partial_gb, n, [&](int i) { return acc_w[i / V][i % V]; },
        [&](int i) { return acc_b[i / V][i % V]; });
  }
}

// Dynamic shared memory of layer_norm_backward_warp_kernel: half the block's warps hand over two sums
// of K V values per lane at once (24 KiB at GPT-2's 768 bf16 features, 64 KiB at the widest, 2048).
template <class S, int K, int V>
constexpr size_t ln_backward_smem_bytes() {
  return static_cast<size_t>(kWarpsPerBlock / 2) * 2 * K * V * 32 * sizeof(S);
}

// Dynamic shared memory of layer_norm_backward_shared_kernel: two sums of K V values per lane for each of
// the block's warps (64 KiB at 1,024 bf16 features, the narrowest it takes, 96 KiB at 1,536, 128 KiB at 2,048).
template <class S, int K, int V>
constexpr size_t ln_backward_shared_smem_bytes() {
  return static_cast<size_t>(kWarpsPerBlock) * 2 * K * V * 32 * sizeof(S);
}

// Two blocks an SM where their shared memory fits two (at most 113 KiB each), so the registers are capped
// at 128 a thread; one otherwise, and the row keeps its registers.
template <class S, int K, int V>
constexpr int ln_backward_shared_blocks_per_sm() {
  return ln_backward_shared_smem_bytes<S, K, V>() <= 113 * 1024 ? 2 : 1;
}

// ga (the skip connection's gradient, added to gx) is read only when Add. Each warp's column sums of
// gy * xhat and gy live in its slice of shared memory, [sum][k][q][lane]: a lane only ever touches its
// own words (no bank conflicts, no synchronisation while rows are walked), and the registers hold just
// the row, so an SM holds two blocks of 8 warps up to 1,536 features (with the sums in registers, one).
template <class T, class W, class S, int K, bool Add>
__global__ void __launch_bounds__(kWarpsPerBlock * 32, ln_backward_shared_blocks_per_sm<S, K, vec_width<T>()>())
    layer_norm_backward_shared_kernel(const T* __restrict__ gy, const T* __restrict__ x, const W* __restrict__ w,
                                      const S* __restrict__ mean, const S* __restrict__ rstd, T* __restrict__ gx,
                                      const T* __restrict__ ga, S* __restrict__ partial_gw, S* __restrict__ partial_gb,
                                      int64_t rows, int n) {
  constexpr int V = vec_width<T>();
  constexpr int kSlot = K * V * 32;  // one sum of one warp
  using C = S;
  extern __shared__ unsigned char ln_smem[];  // ln_backward_shared_smem_bytes<S, K, V>(): every warp's two sums
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  S* acc_w = reinterpret_cast<S*>(ln_smem) + warp * 2 * kSlot + lane;
  S* acc_b = acc_w + kSlot;
#pragma unroll
  for (int i = 0; i < K * V; ++i) acc_w[i * 32] = acc_b[i * 32] = 0;
  const int64_t step = static_cast<int64_t>(gridDim.x) * kWarpsPerBlock;
  // Warps without rows fall through with zero sums: every warp must reach the __syncthreads below.
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + warp; row < rows; row += step) {
    layer_norm_backward_row<T, W, S, K, Add>(gy, x, w, mean, rstd, gx, ga, row, n, [&](int i, C dy, C xhat) {
      acc_w[i * 32] += dy * xhat;
      acc_b[i * 32] += dy;
    });
  }
  // The block's column sums: a fixed pairwise tree over its warps (warp w adds warp w + half's slice, for
  // half = 4, 2, 1), so the order of the additions, and the bits of the result, never change.
#pragma unroll
  for (int half = kWarpsPerBlock / 2; half >= 1; half /= 2) {
    __syncthreads();
    if (warp < half) {
      const S* src_w = acc_w + half * 2 * kSlot;
#pragma unroll
      for (int i = 0; i < K * V; ++i) {
        acc_w[i * 32] += src_w[i * 32];
        acc_b[i * 32] += src_w[kSlot + i * 32];
      }
    }
  }
  if (warp == 0) {
    write_partial_row<K, V>(
        partial_gw, partial_gb, n, [&](int i) { return acc_w[i * 32]; }, [&](int i) { return acc_b[i * 32]; });
  }
}

// ---- fallback: one block per row (forward), kRowsPerChunk rows per block (backward) ---------------

template <class T, class W, class S>
__global__ void layer_norm_forward_kernel(const T* __restrict__ x, const W* __restrict__ w, const W* __restrict__ b,
                                          T* __restrict__ y, S* __restrict__ mean, S* __restrict__ rstd, int64_t n,
                                          double eps) {
  using C = S;
  __shared__ C scratch[32];
  const int64_t row = blockIdx.x;
  const T* xr = x + row * n;
  C sum = 0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) sum += convert<C>(xr[i]);
  const C mu = block_sum(sum, scratch) / static_cast<C>(n);
  C sq = 0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    C d = convert<C>(xr[i]) - mu;
    sq += d * d;
  }
  const C rs = C(1) / sqrt(block_sum(sq, scratch) / static_cast<C>(n) + static_cast<C>(eps));
  if (threadIdx.x == 0) {
    mean[row] = mu;
    rstd[row] = rs;
  }
  T* yr = y + row * n;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    yr[i] = convert<T>((convert<C>(xr[i]) - mu) * rs * convert<C>(w[i]) + convert<C>(b[i]));
  }
}

template <class T, class W, class S>
__global__ void layer_norm_backward_kernel(const T* __restrict__ gy, const T* __restrict__ x, const W* __restrict__ w,
                                           const S* __restrict__ mean, const S* __restrict__ rstd, T* __restrict__ gx,
                                           const T* __restrict__ ga, S* __restrict__ partial_gw,
                                           S* __restrict__ partial_gb, int64_t rows, int64_t n) {
  using C = S;
  __shared__ C scratch[32];
  const int64_t first = static_cast<int64_t>(blockIdx.x) * kRowsPerChunk;
  const int64_t last = first + kRowsPerChunk < rows ? first + kRowsPerChunk : rows;
  S* pgw = partial_gw + static_cast<int64_t>(blockIdx.x) * n;
  S* pgb = partial_gb + static_cast<int64_t>(blockIdx.x) * n;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    pgw[i] = 0;
    pgb[i] = 0;
  }
  for (int64_t row = first; row < last; ++row) {
    const T* xr = x + row * n;
    const T* gyr = gy + row * n;
    const C mu = mean[row], rs = rstd[row];
    C sum_g = 0, sum_gx = 0;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
      C xhat = (convert<C>(xr[i]) - mu) * rs;
      C g = convert<C>(gyr[i]) * convert<C>(w[i]);
      sum_g += g;
      sum_gx += g * xhat;
    }
    const C mean_g = block_sum(sum_g, scratch) / static_cast<C>(n);
    const C mean_gx = block_sum(sum_gx, scratch) / static_cast<C>(n);
    T* gxr = gx + row * n;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
      C dy = convert<C>(gyr[i]);
      C xhat = (convert<C>(xr[i]) - mu) * rs;
      const C add = ga ? convert<C>(ga[row * n + i]) : C(0);  // the skip connection's gradient, if any
      gxr[i] = convert<T>(rs * (dy * convert<C>(w[i]) - mean_g - xhat * mean_gx) + add);
      pgw[i] += dy * xhat;
      pgb[i] += dy;
    }
  }
}

// gw[i] = sum over chunks of partial_gw[chunk][i] (likewise gb). Block (32, kSumLanes) owns 32 columns:
// thread (tx, ty) adds chunks ty, ty + kSumLanes, ... of column tx in order (a warp reads 32 neighbouring
// values), then thread (tx, 0) adds the kSumLanes sums in ty order. Fixed order, so fixed bits.
constexpr int kSumLanes = 16;

template <class W, class S>
__global__ void __launch_bounds__(32 * kSumLanes)
    column_sum_kernel(const S* __restrict__ partial_gw, const S* __restrict__ partial_gb, int64_t chunks, int64_t n,
                      W* __restrict__ gw, W* __restrict__ gb) {
  __shared__ S sw[kSumLanes][33], sb[kSumLanes][33];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t col = static_cast<int64_t>(blockIdx.x) * 32 + tx;
  S w = 0, b = 0;
  if (col < n) {
    for (int64_t c = ty; c < chunks; c += kSumLanes) {
      w += partial_gw[c * n + col];
      b += partial_gb[c * n + col];
    }
  }
  sw[ty][tx] = w;
  sb[ty][tx] = b;
  __syncthreads();
  if (ty == 0 && col < n) {
    for (int l = 1; l < kSumLanes; ++l) {
      w += sw[l][tx];
      b += sb[l][tx];
    }
    gw[col] = convert<W>(w);
    gb[col] = convert<W>(b);
  }
}

// Vectors per lane for the warp-per-row path, or 0 when the row does not fit it.
template <class T, class W>
int warp_row_vectors(int64_t n, const void* x, const void* y, const void* w, const void* b) {
  constexpr int V = vec_width<T>();
  if (n <= 0 || n % V != 0 || n > int64_t{32} * kMaxVecsPerLane * V) return 0;
  const uintptr_t wa = static_cast<uintptr_t>(V) * sizeof(W);
  if (!aligned16(x) || !aligned16(y) || reinterpret_cast<uintptr_t>(w) % wa != 0 ||
      (b != nullptr && reinterpret_cast<uintptr_t>(b) % wa != 0)) {
    return 0;
  }
  const int per_lane = static_cast<int>((n / V + 31) / 32);
  // Instantiated counts: 1, 2, 3, 4, 6, 8.
  if (per_lane <= 4) return per_lane;
  return per_lane <= 6 ? 6 : 8;
}

// Calls f(std::integral_constant<int, K>{}) for the instantiated vector counts.
template <class F>
void with_vectors(int k, F&& f) {
  switch (k) {
    case 1:
      f(std::integral_constant<int, 1>{});
      break;
    case 2:
      f(std::integral_constant<int, 2>{});
      break;
    case 3:
      f(std::integral_constant<int, 3>{});
      break;
    case 4:
      f(std::integral_constant<int, 4>{});
      break;
    case 6:
      f(std::integral_constant<int, 6>{});
      break;
    default:
      f(std::integral_constant<int, 8>{});
      break;
  }
}

// The fast path is instantiated for weights of the input dtype or float32 (mixed-precision masters).
template <class T, class W>
constexpr bool kWarpRowWeights = std::is_same_v<T, W> || std::is_same_v<W, float>;

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Partial rows of gw/gb that backward writes: one per block on the fast path (k vectors a lane; the grid
// depends only on the row count and width, so the order of every addition is fixed), one per
// kRowsPerChunk rows on the fallback (k == 0).
int64_t backward_chunks(int64_t rows, int k, int vector_width) {
  if (k == 0) return ceil_div(rows, kRowsPerChunk);
  if (shared_sums_for(k, vector_width)) {
    return std::min(ceil_div(rows, kWarpsPerBlock * kSharedRowsPerWarp), kSharedMaxBlocks);
  }
  return std::min(ceil_div(rows, kWarpsPerBlock * kBwdRowsPerWarp), kBwdMaxBlocks);
}

}  // namespace

void layer_norm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& y, const Tensor& mean,
                        const Tensor& rstd, int64_t rows, int64_t n, double eps) {
  if (rows == 0 || n == 0) return;
  cudaStream_t stream = cuda::current_stream(x.device().index);
  visit_floating(x.dtype(), "layer_norm", [&](auto xt) {
    using T = decltype(xt);
    using S = Stats<T>;
    visit_floating(weight.dtype(), "layer_norm weight", [&](auto wt) {
      using W = decltype(wt);
      if constexpr (kWarpRowWeights<T, W>) {
        const int k = warp_row_vectors<T, W>(n, x.data_ptr(), y.data_ptr(), weight.data_ptr(), bias.data_ptr());
        if (k > 0) {
          with_vectors(k, [&](auto kc) {
            const auto blocks = static_cast<unsigned>(ceil_div(rows, kWarpsPerBlock));
            layer_norm_forward_warp_kernel<T, W, S, decltype(kc)::value><<<blocks, kWarpsPerBlock * 32, 0, stream>>>(
                x.data<T>(), weight.data<W>(), bias.data<W>(), y.data<T>(), mean.data<S>(), rstd.data<S>(), rows,
                static_cast<int>(n), eps);
          });
          DPT_CUDA_CHECK_LAUNCH();
          return;
        }
      }
      layer_norm_forward_kernel<T, W, S><<<static_cast<unsigned>(rows), std::min(row_threads(n), 256), 0, stream>>>(
          x.data<T>(), weight.data<W>(), bias.data<W>(), y.data<T>(), mean.data<S>(), rstd.data<S>(), n, eps);
      DPT_CUDA_CHECK_LAUNCH();
    });
  });
}

void layer_norm_backward(const Tensor& grad_y, const Tensor& x, const Tensor& weight, const Tensor& mean,
                         const Tensor& rstd, const Tensor& grad_x, const Tensor& grad_weight, const Tensor& grad_bias,
                         int64_t rows, int64_t n, const Tensor& grad_add) {
  if (n == 0) return;
  const bool add = grad_add.defined();
  int device = x.device().index;
  cudaStream_t stream = cuda::current_stream(device);
  visit_floating(x.dtype(), "layer_norm backward", [&](auto xt) {
    using T = decltype(xt);
    using S = Stats<T>;
    visit_floating(weight.dtype(), "layer_norm backward weight", [&](auto wt) {
      using W = decltype(wt);
      if (rows == 0) {  // no rows: the parameter gradients are empty sums (all-zero bits in every dtype)
        DPT_CUDA_CHECK(cudaMemsetAsync(grad_weight.data_ptr(), 0, static_cast<size_t>(n) * sizeof(W), stream));
        DPT_CUDA_CHECK(cudaMemsetAsync(grad_bias.data_ptr(), 0, static_cast<size_t>(n) * sizeof(W), stream));
        return;
      }
      int k = 0;
      if constexpr (kWarpRowWeights<T, W>) {
        k = std::min(warp_row_vectors<T, W>(n, x.data_ptr(), grad_x.data_ptr(), weight.data_ptr(), nullptr),
                     aligned16(grad_y.data_ptr()) && (!add || aligned16(grad_add.data_ptr())) ? 8 : 0);
      }
      const int64_t chunks = backward_chunks(rows, k, vec_width<T>());
      DeviceBuffer partial(static_cast<size_t>(2 * chunks * n) * sizeof(S), device);
      S* pgw = partial.as<S>();
      S* pgb = pgw + chunks * n;
      if constexpr (kWarpRowWeights<T, W>) {
        if (k > 0) {
          with_vectors(k, [&](auto kc) {
            constexpr int K = decltype(kc)::value;
            constexpr int V = vec_width<T>();
            auto launch = [&](auto* kernel, size_t smem) {
              if (smem > 48 * 1024) {  // wide rows: past the default dynamic shared memory limit
                DPT_CUDA_CHECK(
                    cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
              }
              kernel<<<static_cast<unsigned>(chunks), kWarpsPerBlock * 32, smem, stream>>>(
                  grad_y.data<T>(), x.data<T>(), weight.data<W>(), mean.data<S>(), rstd.data<S>(), grad_x.data<T>(),
                  add ? grad_add.data<T>() : nullptr, pgw, pgb, rows, static_cast<int>(n));
            };
            if constexpr (shared_sums_for(K, V)) {
              launch(add ? layer_norm_backward_shared_kernel<T, W, S, K, true>
                         : layer_norm_backward_shared_kernel<T, W, S, K, false>,
                     ln_backward_shared_smem_bytes<S, K, V>());
            } else {
              launch(add ? layer_norm_backward_warp_kernel<T, W, S, K, true>
                         : layer_norm_backward_warp_kernel<T, W, S, K, false>,
                     ln_backward_smem_bytes<S, K, V>());
            }
          });
        }
      }
      if (k == 0) {
        layer_norm_backward_kernel<T, W, S>
            <<<static_cast<unsigned>(chunks), std::min(row_threads(n), 256), 0, stream>>>(
                grad_y.data<T>(), x.data<T>(), weight.data<W>(), mean.data<S>(), rstd.data<S>(), grad_x.data<T>(),
                add ? grad_add.data<T>() : nullptr, pgw, pgb, rows, n);
      }
      DPT_CUDA_CHECK_LAUNCH();
      column_sum_kernel<W, S><<<static_cast<unsigned>(ceil_div(n, 32)), dim3(32, kSumLanes), 0, stream>>>(
          pgw, pgb, chunks, n, grad_weight.data<W>(), grad_bias.data<W>());
      DPT_CUDA_CHECK_LAUNCH();
    });
  });
}

}  // namespace dpt::cuda_kernels
