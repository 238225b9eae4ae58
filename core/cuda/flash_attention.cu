// Fused causal attention, FlashAttention-2 style (math in core/ops_flash_attention.h).
//
// Algorithm. Per (head, tile of kBr queries) the forward streams the key/value tiles 0..diagonal
// through shared memory (tiles entirely above the diagonal are never loaded) and keeps, per query row,
// the running maximum m (log2 units), the running sum l and the unnormalised output O in registers:
//   S = scale log2(e) Q K^T (masked),  m' = max(m, rowmax S),  P = 2^(S - m'),
//   l = l 2^(m - m') + rowsum P,       O = O 2^(m - m') + P V,
// and at the end writes O / l once, and lse = (m + log2 l) ln 2 (natural units) for the backward.
// The backward has three kernels:
//   1. dvec_i = dO_i . O_i (one warp per row);
//   2. per key tile: loop over the query tiles at or below the diagonal, recompute P = exp(S - lse) and
//      dP = dO V^T, dS = P (dP - dvec), and accumulate dV += P^T dO, dK += scale dS^T Q in registers;
//   3. per query tile: loop over the key tiles up to the diagonal, recompute P and dS the same way and
//      accumulate dQ += scale dS K in registers.
// Kernel 3 recomputes S and dP a second time instead of adding dQ with atomics from kernel 2.
//
// Determinism. Every output element (O, lse, dQ, dK, dV, dvec) is written by exactly one thread (or
// one warp's fragment store), which sums its terms in a fixed order; the cross-thread sums are warp
// shuffles and MMA instructions in a fixed pattern. No atomics: the same inputs give the same bits on
// every run.
//
// bfloat16 runs by default on the mma.sync kernels of core/cuda/flash_attention_mma.cu (same algorithm,
// fragments in registers, cp.async double buffering; its own comment gives the layouts). Only those
// kernels take strided operands (flash_attention_*_strided, used by causal_attention_qkv on a packed
// [B, T, 3C] projection); the WMMA and SIMT kernels below read contiguous [bh, t, d] only. The two
// implementations below remain: DPT_FLASH_IMPL=wmma selects the WMMA kernels and DPT_FLASH_IMPL=simt
// (or DPT_FLASH_SIMT=1) the SIMT kernels for bfloat16, so a regression can be isolated on a GPU machine.
//
// Two implementations of the same tiles (kBr = kBc = 64 everywhere):
//
// * bfloat16 (DPT_FLASH_IMPL=wmma): tensor cores (WMMA bf16 16x16x16 fragments, float accumulators),
//   4 warps per block; warp w owns rows 16 w .. 16 w + 15 of the block's 64-row tile (queries in the
//   forward and the dQ kernel, keys in the dK/dV kernel). Tile products go through the warp's float scratch in shared
//   memory, where lane 2 r + h applies the mask and the softmax to half h of row r (the accumulator
//   fragment layout is unspecified, and the online rescale needs rows); P and dS are rounded to bf16
//   for the next product, as FlashAttention-2 does. The forward keeps O in registers in the lane
//   layout; the backward never rescales, so dK, dV and dQ stay in fragments for the whole loop. 16-row
//   blocks entirely above the diagonal are skipped inside the diagonal tile too.
//   Shared memory, rows padded by 16 bytes (bf16 tiles: D + 8, scores: 64 + 4 floats, P: 64 + 8):
//     forward   Q, K, V bf16 tiles + per warp S / P V scratch and P      D=32: 41 KB  D=64: 53 KB  D=128: 93 KB
//     dK/dV     K, V, Q, dO + per warp S^T, dP^T, P^T, dS^T               D=32: 73 KB  D=64: 89 KB  D=128: 137 KB
//     dQ        Q, dO, K, V + per warp S, dP, dS                          D=32: 64 KB  D=64: 80 KB  D=128: 128 KB
//   Used when every tensor starts 16-byte aligned (tile loads are 16-byte vectors) and
//   DPT_FLASH_IMPL=wmma. (The mma kernels have the same alignment requirement.)
//
// * float32, float16 (and bfloat16 when asked or misaligned): SIMT, float32 arithmetic. float16 always
//   takes this path: the tensor-core kernels are written for bf16 fragments only. 256 threads form a
//   16 x 16 grid (ty = tid / 16, tx = tid % 16); a thread owns rows ty + 16 i and columns tx + 16 j of
//   each tile product (4 x 4 of a 64 x 64 score tile: each shared-memory load is reused 4 times), so a
//   row's 16 owners are 16 consecutive lanes (row reductions are 4 shuffles) and a row's m and l live
//   in those lanes. Shared memory in float32, rows padded to LD = D + 1 floats so the 16 rows a
//   half-warp reads sit in 16 different banks:
//     forward   Q, K, V 3 * 64 * LD + P 64 * 65                           D=32: 41 KB  D=64: 65 KB  D=128: 113 KB
//     dK/dV     K, V, Q, dO 4 * 64 * LD + P^T, dS^T 2 * 64 * 65           D=32: 66 KB  D=64: 98 KB  D=128: 162 KB
//     dQ        Q, dO, K, V 4 * 64 * LD + dS 64 * 65                      D=32: 50 KB  D=64: 82 KB  D=128: 146 KB
//
// Why 64 x 64 tiles: large enough to amortise each K/V tile load over 64 queries (and 4 warps), small
// enough that the causal loop skips most of the masked triangle, and T = 1024 gives 16 query tiles x
// B H heads of blocks (192 x 16 for GPT-2 124M at B = 16). All kernels use dynamic shared memory above
// the 48 KB default (opted in per launch; Hopper allows 227 KB per block). The grid is (B H, tiles)
// with the heaviest tiles (most keys, or most queries) first, so the short ones fill in at the end.
#include <mma.h>

#include <cmath>
#include <cstdlib>
#include <cstring>

#include "core/cuda/flash_attention_mma.cuh"
#include "core/cuda/kernel_utils.cuh"
#include "core/flash_attention_kernels.h"

namespace dpt::cuda_kernels {

namespace {

namespace wmma = nvcuda::wmma;

constexpr int kFlashThreads = 256;
constexpr int kBr = 64;  // query rows per tile
constexpr int kBc = 64;  // key rows per tile
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// Rows [first, first + ROWS) of a [t, D] matrix into a padded float tile dst[ROWS][D + 1]; rows at or
// beyond t read as zeros (so masked terms multiply zeros, never uninitialised memory).
template <int D, int ROWS, class T>
__device__ __forceinline__ void load_tile(const T* __restrict__ src, int first, int t, float* __restrict__ dst) {
  constexpr int kLd = D + 1;
  for (int e = threadIdx.x; e < ROWS * D; e += kFlashThreads) {
    const int r = e / D, c = e % D;
    const int row = first + r;
    dst[r * kLd + c] = row < t ? convert<float>(src[static_cast<int64_t>(row) * D + c]) : 0.0f;
  }
}

// Max and sum over the 16 lanes that own one row (lanes 0-15 or 16-31 of a warp).
__device__ __forceinline__ float row_max16(float v) {
  for (int s = 8; s > 0; s >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, s));
  return v;
}
__device__ __forceinline__ float row_sum16(float v) {
  for (int s = 8; s > 0; s >>= 1) v += __shfl_xor_sync(0xffffffffu, v, s);
  return v;
}

template <int D>
constexpr size_t forward_smem_bytes() {
  return sizeof(float) * static_cast<size_t>((kBr + 2 * kBc) * (D + 1) + kBr * (kBc + 1));
}
template <int D>
constexpr size_t backward_kv_smem_bytes() {
  return sizeof(float) * static_cast<size_t>((2 * kBc + 2 * kBr) * (D + 1) + 2 * kBc * (kBr + 1) + 2 * kBr);
}
template <int D>
constexpr size_t backward_q_smem_bytes() {
  return sizeof(float) * static_cast<size_t>((2 * kBr + 2 * kBc) * (D + 1) + kBr * (kBc + 1) + 2 * kBr);
}

// grid (bh, query tiles); the heaviest query tiles (most keys) have the lowest blockIdx.y, so they are
// scheduled first and the short tiles fill in behind them.
template <class T, int D>
__global__ void __launch_bounds__(kFlashThreads)
    flash_forward_kernel(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v, T* __restrict__ out,
                         float* __restrict__ lse, int t, float scale_log2) {
  constexpr int kLd = D + 1, kLp = kBc + 1;
  constexpr int kRm = kBr / 16, kCn = kBc / 16, kDn = D / 16;
  extern __shared__ float smem[];
  float* qs = smem;            // [kBr][kLd]
  float* ks = qs + kBr * kLd;  // [kBc][kLd]
  float* vs = ks + kBc * kLd;  // [kBc][kLd]
  float* ps = vs + kBc * kLd;  // [kBr][kLp]
  const int ty = threadIdx.x / 16, tx = threadIdx.x % 16;
  const int q0 = (gridDim.y - 1 - blockIdx.y) * kBr;
  const int64_t base = static_cast<int64_t>(blockIdx.x) * t * D;
  load_tile<D, kBr>(q + base, q0, t, qs);

  float m[kRm], l[kRm], acc[kRm][kDn];
#pragma unroll
  for (int i = 0; i < kRm; ++i) {
    m[i] = -INFINITY;
    l[i] = 0.0f;
#pragma unroll
    for (int n = 0; n < kDn; ++n) acc[i][n] = 0.0f;
  }

  // Key tiles 0 .. the one holding the last key any row of this tile may see. Tile 0 holds key 0,
  // which every row sees, so m is finite after the first tile and 2^(m - m') never sees -inf - -inf.
  const int last_key = min(q0 + kBr, t) - 1;
  const int key_tiles = last_key / kBc + 1;
  for (int kt = 0; kt < key_tiles; ++kt) {
    const int k0 = kt * kBc;
    __syncthreads();  // everyone is done with the previous K, V and P
    load_tile<D, kBc>(k + base, k0, t, ks);
    load_tile<D, kBc>(v + base, k0, t, vs);
    __syncthreads();

    float s[kRm][kCn];
#pragma unroll
    for (int i = 0; i < kRm; ++i)
#pragma unroll
      for (int j = 0; j < kCn; ++j) s[i][j] = 0.0f;
#pragma unroll 8
    for (int c = 0; c < D; ++c) {
      float a[kRm], b[kCn];
#pragma unroll
      for (int i = 0; i < kRm; ++i) a[i] = qs[(ty + 16 * i) * kLd + c];
#pragma unroll
      for (int j = 0; j < kCn; ++j) b[j] = ks[(tx + 16 * j) * kLd + c];
#pragma unroll
      for (int i = 0; i < kRm; ++i)
#pragma unroll
        for (int j = 0; j < kCn; ++j) s[i][j] = fmaf(a[i], b[j], s[i][j]);
    }

#pragma unroll
    for (int i = 0; i < kRm; ++i) {
      const int row = q0 + ty + 16 * i;
      float mx = -INFINITY;
#pragma unroll
      for (int j = 0; j < kCn; ++j) {
        const int col = k0 + tx + 16 * j;
        s[i][j] = (col > row || col >= t) ? -INFINITY : s[i][j] * scale_log2;
        mx = fmaxf(mx, s[i][j]);
      }
      const float m_new = fmaxf(m[i], row_max16(mx));
      const float alpha = exp2f(m[i] - m_new);
      m[i] = m_new;
      l[i] *= alpha;
#pragma unroll
      for (int n = 0; n < kDn; ++n) acc[i][n] *= alpha;
#pragma unroll
      for (int j = 0; j < kCn; ++j) {
        const float p = exp2f(s[i][j] - m_new);
        l[i] += p;
        ps[(ty + 16 * i) * kLp + tx + 16 * j] = p;
      }
    }
    __syncthreads();

#pragma unroll 8
    for (int c = 0; c < kBc; ++c) {
      float a[kRm], b[kDn];
#pragma unroll
      for (int i = 0; i < kRm; ++i) a[i] = ps[(ty + 16 * i) * kLp + c];
#pragma unroll
      for (int n = 0; n < kDn; ++n) b[n] = vs[c * kLd + tx + 16 * n];
#pragma unroll
      for (int i = 0; i < kRm; ++i)
#pragma unroll
        for (int n = 0; n < kDn; ++n) acc[i][n] = fmaf(a[i], b[n], acc[i][n]);
    }
  }

#pragma unroll
  for (int i = 0; i < kRm; ++i) {
    const int row = q0 + ty + 16 * i;
    const float sum = row_sum16(l[i]);  // all 32 lanes take part, so the shuffle precedes the row test
    if (row < t) {
      const float inv = 1.0f / sum;
#pragma unroll
      for (int n = 0; n < kDn; ++n)
        out[base + static_cast<int64_t>(row) * D + tx + 16 * n] = convert<T>(acc[i][n] * inv);
      if (tx == 0) lse[static_cast<int64_t>(blockIdx.x) * t + row] = (m[i] + log2f(sum)) * kLn2;
    }
  }
}

// dvec[row] = sum_c dO[row, c] O[row, c]: one warp per row.
template <class T, int D>
__global__ void flash_backward_dot_kernel(const T* __restrict__ out, const T* __restrict__ grad_out,
                                          float* __restrict__ dvec, int64_t rows) {
  const int lane = threadIdx.x & 31;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  if (row >= rows) return;
  float s = 0.0f;
  for (int c = lane; c < D; c += 32) s += convert<float>(grad_out[row * D + c]) * convert<float>(out[row * D + c]);
  s = warp_sum(s);
  if (lane == 0) dvec[row] = s;
}

// Loads the per-row statistics of query rows [q0, q0 + kBr): lse in log2 units and dvec.
__device__ __forceinline__ void load_row_stats(const float* __restrict__ lse, const float* __restrict__ dvec,
                                               int64_t row_base, int q0, int t, float* lse_s, float* dvec_s) {
  for (int r = threadIdx.x; r < kBr; r += kFlashThreads) {
    const int row = q0 + r;
    lse_s[r] = row < t ? lse[row_base + row] * kLog2e : 0.0f;
    dvec_s[r] = row < t ? dvec[row_base + row] : 0.0f;
  }
}

// grid (bh, key tiles): block owns keys [k0, k0 + kBc), loops over query tiles from the diagonal down.
template <class T, int D>
__global__ void __launch_bounds__(kFlashThreads)
    flash_backward_kv_kernel(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                             const T* __restrict__ grad_out, const float* __restrict__ lse,
                             const float* __restrict__ dvec, T* __restrict__ grad_k, T* __restrict__ grad_v, int t,
                             float scale, float scale_log2) {
  constexpr int kLd = D + 1, kLp = kBr + 1;
  constexpr int kRk = kBc / 16, kCq = kBr / 16, kDn = D / 16;
  extern __shared__ float smem[];
  float* ks = smem;                // [kBc][kLd]
  float* vs = ks + kBc * kLd;      // [kBc][kLd]
  float* qs = vs + kBc * kLd;      // [kBr][kLd]
  float* dos = qs + kBr * kLd;     // [kBr][kLd]
  float* ps = dos + kBr * kLd;     // [kBc][kLp]  P^T: key rows, query columns
  float* dss = ps + kBc * kLp;     // [kBc][kLp]  dS^T
  float* lse_s = dss + kBc * kLp;  // [kBr]
  float* dvec_s = lse_s + kBr;     // [kBr]
  const int ty = threadIdx.x / 16, tx = threadIdx.x % 16;
  const int k0 = blockIdx.y * kBc;  // key tile 0 sees every query: heaviest first
  const int64_t base = static_cast<int64_t>(blockIdx.x) * t * D;
  const int64_t row_base = static_cast<int64_t>(blockIdx.x) * t;
  load_tile<D, kBc>(k + base, k0, t, ks);
  load_tile<D, kBc>(v + base, k0, t, vs);

  float dk[kRk][kDn], dv[kRk][kDn];
#pragma unroll
  for (int i = 0; i < kRk; ++i)
#pragma unroll
    for (int n = 0; n < kDn; ++n) dk[i][n] = dv[i][n] = 0.0f;

  const int q_tiles = (t + kBr - 1) / kBr;
  for (int qt = k0 / kBr; qt < q_tiles; ++qt) {
    const int q0 = qt * kBr;
    __syncthreads();  // everyone is done with the previous Q, dO, P and dS
    load_tile<D, kBr>(q + base, q0, t, qs);
    load_tile<D, kBr>(grad_out + base, q0, t, dos);
    load_row_stats(lse, dvec, row_base, q0, t, lse_s, dvec_s);
    __syncthreads();

    // S^T = K Q^T and dP^T = V dO^T for this thread's 4 keys x 4 queries.
    float s[kRk][kCq], dp[kRk][kCq];
#pragma unroll
    for (int i = 0; i < kRk; ++i)
#pragma unroll
      for (int j = 0; j < kCq; ++j) s[i][j] = dp[i][j] = 0.0f;
#pragma unroll 4
    for (int c = 0; c < D; ++c) {
      float ak[kRk], av[kRk], bq[kCq], bo[kCq];
#pragma unroll
      for (int i = 0; i < kRk; ++i) {
        ak[i] = ks[(ty + 16 * i) * kLd + c];
        av[i] = vs[(ty + 16 * i) * kLd + c];
      }
#pragma unroll
      for (int j = 0; j < kCq; ++j) {
        bq[j] = qs[(tx + 16 * j) * kLd + c];
        bo[j] = dos[(tx + 16 * j) * kLd + c];
      }
#pragma unroll
      for (int i = 0; i < kRk; ++i)
#pragma unroll
        for (int j = 0; j < kCq; ++j) {
          s[i][j] = fmaf(ak[i], bq[j], s[i][j]);
          dp[i][j] = fmaf(av[i], bo[j], dp[i][j]);
        }
    }
#pragma unroll
    for (int i = 0; i < kRk; ++i) {
      const int key = k0 + ty + 16 * i;
#pragma unroll
      for (int j = 0; j < kCq; ++j) {
        const int r = tx + 16 * j, row = q0 + r;
        const bool visible = row < t && key <= row;
        const float p = visible ? exp2f(s[i][j] * scale_log2 - lse_s[r]) : 0.0f;
        ps[(ty + 16 * i) * kLp + r] = p;
        dss[(ty + 16 * i) * kLp + r] = p * (dp[i][j] - dvec_s[r]);
      }
    }
    __syncthreads();

    // dV += P^T dO and dK += dS^T Q (scale applied once at the end).
#pragma unroll 4
    for (int r = 0; r < kBr; ++r) {
      float ap[kRk], as[kRk], bo[kDn], bq[kDn];
#pragma unroll
      for (int i = 0; i < kRk; ++i) {
        ap[i] = ps[(ty + 16 * i) * kLp + r];
        as[i] = dss[(ty + 16 * i) * kLp + r];
      }
#pragma unroll
      for (int n = 0; n < kDn; ++n) {
        bo[n] = dos[r * kLd + tx + 16 * n];
        bq[n] = qs[r * kLd + tx + 16 * n];
      }
#pragma unroll
      for (int i = 0; i < kRk; ++i)
#pragma unroll
        for (int n = 0; n < kDn; ++n) {
          dv[i][n] = fmaf(ap[i], bo[n], dv[i][n]);
          dk[i][n] = fmaf(as[i], bq[n], dk[i][n]);
        }
    }
  }

#pragma unroll
  for (int i = 0; i < kRk; ++i) {
    const int key = k0 + ty + 16 * i;
    if (key < t) {
#pragma unroll
      for (int n = 0; n < kDn; ++n) {
        const int64_t at = base + static_cast<int64_t>(key) * D + tx + 16 * n;
        grad_k[at] = convert<T>(dk[i][n] * scale);
        grad_v[at] = convert<T>(dv[i][n]);
      }
    }
  }
}

// grid (bh, query tiles): block owns queries [q0, q0 + kBr), loops over key tiles up to the diagonal.
template <class T, int D>
__global__ void __launch_bounds__(kFlashThreads)
    flash_backward_q_kernel(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                            const T* __restrict__ grad_out, const float* __restrict__ lse,
                            const float* __restrict__ dvec, T* __restrict__ grad_q, int t, float scale,
                            float scale_log2) {
  constexpr int kLd = D + 1, kLp = kBc + 1;
  constexpr int kRm = kBr / 16, kCn = kBc / 16, kDn = D / 16;
  extern __shared__ float smem[];
  float* qs = smem;                // [kBr][kLd]
  float* dos = qs + kBr * kLd;     // [kBr][kLd]
  float* ks = dos + kBr * kLd;     // [kBc][kLd]
  float* vs = ks + kBc * kLd;      // [kBc][kLd]
  float* dss = vs + kBc * kLd;     // [kBr][kLp]
  float* lse_s = dss + kBr * kLp;  // [kBr]
  float* dvec_s = lse_s + kBr;     // [kBr]
  const int ty = threadIdx.x / 16, tx = threadIdx.x % 16;
  const int q0 = (gridDim.y - 1 - blockIdx.y) * kBr;
  const int64_t base = static_cast<int64_t>(blockIdx.x) * t * D;
  load_tile<D, kBr>(q + base, q0, t, qs);
  load_tile<D, kBr>(grad_out + base, q0, t, dos);
  load_row_stats(lse, dvec, static_cast<int64_t>(blockIdx.x) * t, q0, t, lse_s, dvec_s);

  float dq[kRm][kDn];
#pragma unroll
  for (int i = 0; i < kRm; ++i)
#pragma unroll
    for (int n = 0; n < kDn; ++n) dq[i][n] = 0.0f;

  const int key_tiles = (min(q0 + kBr, t) - 1) / kBc + 1;
  for (int kt = 0; kt < key_tiles; ++kt) {
    const int k0 = kt * kBc;
    __syncthreads();  // everyone is done with the previous K, V and dS (and, at kt = 0, Q, dO are loaded)
    load_tile<D, kBc>(k + base, k0, t, ks);
    load_tile<D, kBc>(v + base, k0, t, vs);
    __syncthreads();

    float s[kRm][kCn], dp[kRm][kCn];
#pragma unroll
    for (int i = 0; i < kRm; ++i)
#pragma unroll
      for (int j = 0; j < kCn; ++j) s[i][j] = dp[i][j] = 0.0f;
#pragma unroll 4
    for (int c = 0; c < D; ++c) {
      float aq[kRm], ao[kRm], bk[kCn], bv[kCn];
#pragma unroll
      for (int i = 0; i < kRm; ++i) {
        aq[i] = qs[(ty + 16 * i) * kLd + c];
        ao[i] = dos[(ty + 16 * i) * kLd + c];
      }
#pragma unroll
      for (int j = 0; j < kCn; ++j) {
        bk[j] = ks[(tx + 16 * j) * kLd + c];
        bv[j] = vs[(tx + 16 * j) * kLd + c];
      }
#pragma unroll
      for (int i = 0; i < kRm; ++i)
#pragma unroll
        for (int j = 0; j < kCn; ++j) {
          s[i][j] = fmaf(aq[i], bk[j], s[i][j]);
          dp[i][j] = fmaf(ao[i], bv[j], dp[i][j]);
        }
    }
#pragma unroll
    for (int i = 0; i < kRm; ++i) {
      const int r = ty + 16 * i, row = q0 + r;
#pragma unroll
      for (int j = 0; j < kCn; ++j) {
        const int key = k0 + tx + 16 * j;
        const bool visible = row < t && key <= row;
        const float p = visible ? exp2f(s[i][j] * scale_log2 - lse_s[r]) : 0.0f;
        dss[r * kLp + tx + 16 * j] = p * (dp[i][j] - dvec_s[r]);
      }
    }
    __syncthreads();

#pragma unroll 8
    for (int c = 0; c < kBc; ++c) {
      float a[kRm], b[kDn];
#pragma unroll
      for (int i = 0; i < kRm; ++i) a[i] = dss[(ty + 16 * i) * kLp + c];
#pragma unroll
      for (int n = 0; n < kDn; ++n) b[n] = ks[c * kLd + tx + 16 * n];
#pragma unroll
      for (int i = 0; i < kRm; ++i)
#pragma unroll
        for (int n = 0; n < kDn; ++n) dq[i][n] = fmaf(a[i], b[n], dq[i][n]);
    }
  }

#pragma unroll
  for (int i = 0; i < kRm; ++i) {
    const int row = q0 + ty + 16 * i;
    if (row < t) {
#pragma unroll
      for (int n = 0; n < kDn; ++n)
        grad_q[base + static_cast<int64_t>(row) * D + tx + 16 * n] = convert<T>(dq[i][n] * scale);
    }
  }
}

// --- tensor-core kernels (bfloat16; layout in the comment at the top) -------------------------------

constexpr int kTcWarps = 4;
constexpr int kTcThreads = 32 * kTcWarps;
constexpr int kTcRows = 16 * kTcWarps;  // rows of the block's own tile
constexpr int kTcCols = 64;             // rows of each streamed tile

template <int D>
struct TcLayout {
  static constexpr int kLdIn = D + 8;       // bf16 tiles: rows 16-byte multiples, 16 bytes of bank shift
  static constexpr int kLdS = kTcCols + 4;  // float scores
  static constexpr int kLdP = kTcCols + 8;  // bf16 probabilities / dS
  static constexpr int kLdO = D + 4;        // float staging of a 16 x D result
  static constexpr int kScratch = 16 * (kLdS > kLdO ? kLdS : kLdO);  // floats per warp
  static constexpr size_t kTile = sizeof(bf16_t) * 64 * kLdIn;       // one 64-row bf16 tile, bytes
  static constexpr size_t kScratchBytes = sizeof(float) * kScratch;
  static constexpr size_t kPBytes = sizeof(bf16_t) * 16 * kLdP;
  // Every region is a multiple of 32 bytes, so every fragment pointer below is 256-bit aligned.
  static_assert(kTile % 32 == 0 && kScratchBytes % 32 == 0 && kPBytes % 32 == 0);
  static constexpr size_t kForwardBytes = 3 * kTile + kTcWarps * (kScratchBytes + kPBytes);
  static constexpr size_t kBackwardKvBytes =
      4 * kTile + kTcWarps * (kScratchBytes + sizeof(float) * 16 * kLdS + 2 * kPBytes) + 2 * sizeof(float) * 64;
  static constexpr size_t kBackwardQBytes =
      4 * kTile + kTcWarps * (kScratchBytes + sizeof(float) * 16 * kLdS + kPBytes) + 2 * sizeof(float) * 64;
};

using FragA = wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16_t, wmma::row_major>;
using FragBt = wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16_t, wmma::col_major>;  // B = M^T, M row-major
using FragB = wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16_t, wmma::row_major>;
using FragC = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;

// Rows [first, first + 64) of a bf16 [t, D] matrix into dst[64][D + 8] with 16-byte vectors; rows at
// or beyond t are zeros. The host checks that every tensor starts 16-byte aligned (D * 2 bytes per row
// keeps every row aligned).
template <int D>
__device__ __forceinline__ void load_tile_tc(const bf16_t* __restrict__ src, int first, int t,
                                             bf16_t* __restrict__ dst) {
  constexpr int kVecs = D / 8, kLd = D + 8;
  using V8 = Vec<bf16_t, 8>;
  for (int e = threadIdx.x; e < 64 * kVecs; e += kTcThreads) {
    const int r = e / kVecs, c = (e % kVecs) * 8;
    const int row = first + r;
    V8 val;
    if (row < t) {
      val = *reinterpret_cast<const V8*>(src + static_cast<int64_t>(row) * D + c);
    } else {
#pragma unroll
      for (int i = 0; i < 8; ++i) val.v[i] = __float2bfloat16_rn(0.0f);
    }
    *reinterpret_cast<V8*>(dst + r * kLd + c) = val;
  }
}

// acc (16 x 16) = A rows [16] x B^T over D: A, B row-major bf16 tiles with row stride ld.
template <int D>
__device__ __forceinline__ void product_abt(FragC& acc, const bf16_t* a, const bf16_t* b, int ld) {
  wmma::fill_fragment(acc, 0.0f);
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    FragA fa;
    FragBt fb;
    wmma::load_matrix_sync(fa, a + kk * 16, ld);
    wmma::load_matrix_sync(fb, b + kk * 16, ld);
    wmma::mma_sync(acc, fa, fb, acc);
  }
}

// A warp's 16 x D result (fragments acc[D / 16]) times `factor`, written to rows [row0, row0 + 16) of a
// bf16 [t, D] matrix through the warp's float scratch; rows at or beyond t are skipped.
template <int D>
__device__ __forceinline__ void store_rows_tc(FragC (&acc)[D / 16], float* scratch, bf16_t* __restrict__ dst, int row0,
                                              int t, float factor) {
  constexpr int kLdO = TcLayout<D>::kLdO;
  const int lane = threadIdx.x % 32, r = lane / 2, h = lane % 2;
#pragma unroll
  for (int n = 0; n < D / 16; ++n) wmma::store_matrix_sync(scratch + n * 16, acc[n], kLdO, wmma::mem_row_major);
  __syncwarp();
  if (row0 + r < t) {
    bf16_t* out = dst + static_cast<int64_t>(row0 + r) * D + h * (D / 2);
#pragma unroll
    for (int c = 0; c < D / 2; ++c) out[c] = __float2bfloat16_rn(scratch[r * kLdO + h * (D / 2) + c] * factor);
  }
  __syncwarp();
}

template <int D>
__global__ void __launch_bounds__(kTcThreads)
    flash_forward_tc_kernel(const bf16_t* __restrict__ q, const bf16_t* __restrict__ k, const bf16_t* __restrict__ v,
                            bf16_t* __restrict__ out, float* __restrict__ lse, int t, float scale_log2) {
  using L = TcLayout<D>;
  constexpr int kLd = L::kLdIn, kHalfC = kTcCols / 2, kHalfD = D / 2;
  extern __shared__ __align__(128) unsigned char tc_smem[];
  bf16_t* qs = reinterpret_cast<bf16_t*>(tc_smem);  // [64][kLd]
  bf16_t* ks = qs + 64 * kLd;                       // [64][kLd]
  bf16_t* vs = ks + 64 * kLd;                       // [64][kLd]
  float* scratch_all = reinterpret_cast<float*>(vs + 64 * kLd);
  bf16_t* p_all = reinterpret_cast<bf16_t*>(scratch_all + kTcWarps * L::kScratch);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, r = lane / 2, h = lane % 2;
  float* scratch = scratch_all + warp * L::kScratch;  // S [16][kLdS], then P V [16][kLdO]
  bf16_t* ps = p_all + warp * 16 * L::kLdP;           // P [16][kLdP]
  const int q0 = (gridDim.y - 1 - blockIdx.y) * kTcRows;
  const int w0 = q0 + warp * 16;  // the warp's first query
  const int row = w0 + r;         // this lane's query
  // The lane visits its half row from column (r + 16 h) mod 32 on, so at every step the 32 lanes read
  // 32 different banks of the scratch (rows 4 banks apart, 16 rows, two halves). o[c] likewise holds
  // output column h D/2 + (c + sk) mod D/2.
  const int sk = r + 16 * h;
  const int64_t base = static_cast<int64_t>(blockIdx.x) * t * D;
  load_tile_tc<D>(q + base, q0, t, qs);
  __syncthreads();
  FragA qa[D / 16];  // the warp's Q rows stay in registers for the whole loop
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) wmma::load_matrix_sync(qa[kk], qs + warp * 16 * kLd + kk * 16, kLd);

  float o[kHalfD];
#pragma unroll
  for (int c = 0; c < kHalfD; ++c) o[c] = 0.0f;
  float m = -INFINITY, l = 0.0f;

  const int key_tiles = (min(q0 + kTcRows, t) - 1) / kTcCols + 1;
  for (int kt = 0; kt < key_tiles; ++kt) {
    const int k0 = kt * kTcCols;
    __syncthreads();  // everyone is done with the previous K and V
    load_tile_tc<D>(k + base, k0, t, ks);
    load_tile_tc<D>(v + base, k0, t, vs);
    __syncthreads();
    // 16-key blocks j of this tile with any key at or before the warp's last query (k0 <= q0 always).
    const int n_vis = min(kTcCols / 16, (w0 + 15 - k0) / 16 + 1);
    for (int j = 0; j < n_vis; ++j) {
      FragC acc;
      wmma::fill_fragment(acc, 0.0f);
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        FragBt fb;
        wmma::load_matrix_sync(fb, ks + j * 16 * kLd + kk * 16, kLd);
        wmma::mma_sync(acc, qa[kk], fb, acc);
      }
      wmma::store_matrix_sync(scratch + j * 16, acc, L::kLdS, wmma::mem_row_major);
    }
    __syncwarp();

    // Online softmax on this lane's half row (blocks j >= n_vis are masked here, never read as numbers).
    float s[kHalfC];
    float mx = -INFINITY;
#pragma unroll
    for (int c = 0; c < kHalfC; ++c) {
      const int cc = h * kHalfC + ((c + sk) & (kHalfC - 1)), col = k0 + cc;
      s[c] = (col > row || col >= t) ? -INFINITY : scratch[r * L::kLdS + cc] * scale_log2;
      mx = fmaxf(mx, s[c]);
    }
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    const float m_new = fmaxf(m, mx);  // finite: key 0 is in tile 0 and visible to every row
    const float alpha = exp2f(m - m_new);
    m = m_new;
    l *= alpha;
#pragma unroll
    for (int c = 0; c < kHalfD; ++c) o[c] *= alpha;
#pragma unroll
    for (int c = 0; c < kHalfC; ++c) {
      const float p = exp2f(s[c] - m_new);
      l += p;
      ps[r * L::kLdP + h * kHalfC + ((c + sk) & (kHalfC - 1))] = __float2bfloat16_rn(p);
    }
    __syncwarp();

    // P V for the warp's 16 rows, skipping the all-zero key blocks (static indices keep the P
    // fragments in registers; the bound is warp-uniform).
    FragA pa[kTcCols / 16];
#pragma unroll
    for (int kk = 0; kk < kTcCols / 16; ++kk) {
      if (kk < n_vis) wmma::load_matrix_sync(pa[kk], ps + kk * 16, L::kLdP);
    }
#pragma unroll
    for (int n = 0; n < D / 16; ++n) {
      FragC acc;
      wmma::fill_fragment(acc, 0.0f);
#pragma unroll
      for (int kk = 0; kk < kTcCols / 16; ++kk) {
        if (kk < n_vis) {
          FragB fb;
          wmma::load_matrix_sync(fb, vs + kk * 16 * kLd + n * 16, kLd);
          wmma::mma_sync(acc, pa[kk], fb, acc);
        }
      }
      wmma::store_matrix_sync(scratch + n * 16, acc, L::kLdO, wmma::mem_row_major);
    }
    __syncwarp();
#pragma unroll
    for (int c = 0; c < kHalfD; ++c) o[c] += scratch[r * L::kLdO + h * kHalfD + ((c + sk) & (kHalfD - 1))];
    __syncwarp();  // scratch is rewritten by the next tile's S
  }

  l += __shfl_xor_sync(0xffffffffu, l, 1);
  if (row < t) {
    const float inv = 1.0f / l;
    bf16_t* orow = out + base + static_cast<int64_t>(row) * D + h * kHalfD;
#pragma unroll
    for (int c = 0; c < kHalfD; ++c) orow[(c + sk) & (kHalfD - 1)] = __float2bfloat16_rn(o[c] * inv);
    if (h == 0) lse[static_cast<int64_t>(blockIdx.x) * t + row] = (m + log2f(l)) * kLn2;
  }
}

// grid (bh, key tiles): warp w owns keys k0 + 16 w .. + 15 and accumulates their dK, dV in fragments.
template <int D>
__global__ void __launch_bounds__(kTcThreads)
    flash_backward_kv_tc_kernel(const bf16_t* __restrict__ q, const bf16_t* __restrict__ k,
                                const bf16_t* __restrict__ v, const bf16_t* __restrict__ grad_out,
                                const float* __restrict__ lse, const float* __restrict__ dvec,
                                bf16_t* __restrict__ grad_k, bf16_t* __restrict__ grad_v, int t, float scale,
                                float scale_log2) {
  using L = TcLayout<D>;
  constexpr int kLd = L::kLdIn, kHalfC = kTcCols / 2;
  extern __shared__ __align__(128) unsigned char tc_smem[];
  bf16_t* ks = reinterpret_cast<bf16_t*>(tc_smem);  // [64][kLd] the block's keys
  bf16_t* vs = ks + 64 * kLd;                       // [64][kLd]
  bf16_t* qs = vs + 64 * kLd;                       // [64][kLd] the current query tile
  bf16_t* dos = qs + 64 * kLd;                      // [64][kLd]
  float* s_all = reinterpret_cast<float*>(dos + 64 * kLd);
  float* dp_all = s_all + kTcWarps * L::kScratch;
  bf16_t* p_all = reinterpret_cast<bf16_t*>(dp_all + kTcWarps * 16 * L::kLdS);
  bf16_t* ds_all = p_all + kTcWarps * 16 * L::kLdP;
  float* lse_s = reinterpret_cast<float*>(ds_all + kTcWarps * 16 * L::kLdP);  // [64], log2 units
  float* dvec_s = lse_s + 64;                                                 // [64]
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, r = lane / 2, h = lane % 2;
  float* s_w = s_all + warp * L::kScratch;      // S^T [16 keys][kLdS queries]; epilogue staging
  float* dp_w = dp_all + warp * 16 * L::kLdS;   // dP^T
  bf16_t* p_w = p_all + warp * 16 * L::kLdP;    // P^T
  bf16_t* ds_w = ds_all + warp * 16 * L::kLdP;  // dS^T
  const int k0 = blockIdx.y * kTcRows;          // key tile 0 sees every query: heaviest first
  const int wk0 = k0 + warp * 16;               // the warp's first key
  const int key = wk0 + r;                      // this lane's key
  const int sk = r + 16 * h;                    // column rotation, as in the forward
  const int64_t base = static_cast<int64_t>(blockIdx.x) * t * D;
  const int64_t row_base = static_cast<int64_t>(blockIdx.x) * t;
  load_tile_tc<D>(k + base, k0, t, ks);
  load_tile_tc<D>(v + base, k0, t, vs);

  FragC dk[D / 16], dv[D / 16];
#pragma unroll
  for (int n = 0; n < D / 16; ++n) {
    wmma::fill_fragment(dk[n], 0.0f);
    wmma::fill_fragment(dv[n], 0.0f);
  }

  const int q_tiles = (t + kTcCols - 1) / kTcCols;
  for (int qt = k0 / kTcCols; qt < q_tiles; ++qt) {
    const int q0 = qt * kTcCols;
    __syncthreads();  // everyone is done with the previous Q, dO and statistics
    load_tile_tc<D>(q + base, q0, t, qs);
    load_tile_tc<D>(grad_out + base, q0, t, dos);
    for (int i = threadIdx.x; i < kTcCols; i += kTcThreads) {
      lse_s[i] = q0 + i < t ? lse[row_base + q0 + i] * kLog2e : 0.0f;
      dvec_s[i] = q0 + i < t ? dvec[row_base + q0 + i] : 0.0f;
    }
    __syncthreads();
    // 16-query blocks j with any query at or after the warp's first key (q0 >= k0 always).
    const int j_first = wk0 > q0 ? (wk0 - q0) / 16 : 0;
    for (int j = j_first; j < kTcCols / 16; ++j) {
      FragC acc;
      product_abt<D>(acc, ks + warp * 16 * kLd, qs + j * 16 * kLd, kLd);  // K Q^T
      wmma::store_matrix_sync(s_w + j * 16, acc, L::kLdS, wmma::mem_row_major);
      product_abt<D>(acc, vs + warp * 16 * kLd, dos + j * 16 * kLd, kLd);  // V dO^T
      wmma::store_matrix_sync(dp_w + j * 16, acc, L::kLdS, wmma::mem_row_major);
    }
    __syncwarp();
#pragma unroll 8
    for (int c = 0; c < kHalfC; ++c) {
      const int i = h * kHalfC + ((c + sk) & (kHalfC - 1)), query = q0 + i;  // bank-skewed, see forward
      const bool visible = query < t && key <= query;                        // blocks j < j_first are all invisible
      const float p = visible ? exp2f(s_w[r * L::kLdS + i] * scale_log2 - lse_s[i]) : 0.0f;
      const float ds = visible ? p * (dp_w[r * L::kLdS + i] - dvec_s[i]) : 0.0f;
      p_w[r * L::kLdP + i] = __float2bfloat16_rn(p);
      ds_w[r * L::kLdP + i] = __float2bfloat16_rn(ds);
    }
    __syncwarp();
    // dV += P^T dO, dK += dS^T Q over the visible query blocks.
    for (int kk = j_first; kk < kTcCols / 16; ++kk) {
      FragA fp, fs;
      wmma::load_matrix_sync(fp, p_w + kk * 16, L::kLdP);
      wmma::load_matrix_sync(fs, ds_w + kk * 16, L::kLdP);
#pragma unroll
      for (int n = 0; n < D / 16; ++n) {
        FragB fb;
        wmma::load_matrix_sync(fb, dos + kk * 16 * kLd + n * 16, kLd);
        wmma::mma_sync(dv[n], fp, fb, dv[n]);
        wmma::load_matrix_sync(fb, qs + kk * 16 * kLd + n * 16, kLd);
        wmma::mma_sync(dk[n], fs, fb, dk[n]);
      }
    }
  }
  store_rows_tc<D>(dv, s_w, grad_v + base, wk0, t, 1.0f);
  store_rows_tc<D>(dk, s_w, grad_k + base, wk0, t, scale);
}

// grid (bh, query tiles): warp w owns queries q0 + 16 w .. + 15 and accumulates their dQ in fragments.
template <int D>
__global__ void __launch_bounds__(kTcThreads)
    flash_backward_q_tc_kernel(const bf16_t* __restrict__ q, const bf16_t* __restrict__ k, const bf16_t* __restrict__ v,
                               const bf16_t* __restrict__ grad_out, const float* __restrict__ lse,
                               const float* __restrict__ dvec, bf16_t* __restrict__ grad_q, int t, float scale,
                               float scale_log2) {
  using L = TcLayout<D>;
  constexpr int kLd = L::kLdIn, kHalfC = kTcCols / 2;
  extern __shared__ __align__(128) unsigned char tc_smem[];
  bf16_t* qs = reinterpret_cast<bf16_t*>(tc_smem);  // [64][kLd] the block's queries
  bf16_t* dos = qs + 64 * kLd;                      // [64][kLd]
  bf16_t* ks = dos + 64 * kLd;                      // [64][kLd] the current key tile
  bf16_t* vs = ks + 64 * kLd;                       // [64][kLd]
  float* s_all = reinterpret_cast<float*>(vs + 64 * kLd);
  float* dp_all = s_all + kTcWarps * L::kScratch;
  bf16_t* ds_all = reinterpret_cast<bf16_t*>(dp_all + kTcWarps * 16 * L::kLdS);
  float* lse_s = reinterpret_cast<float*>(ds_all + kTcWarps * 16 * L::kLdP);  // [64], log2 units
  float* dvec_s = lse_s + 64;                                                 // [64]
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, r = lane / 2, h = lane % 2;
  float* s_w = s_all + warp * L::kScratch;      // S [16 queries][kLdS keys]; epilogue staging
  float* dp_w = dp_all + warp * 16 * L::kLdS;   // dP
  bf16_t* ds_w = ds_all + warp * 16 * L::kLdP;  // dS
  const int q0 = (gridDim.y - 1 - blockIdx.y) * kTcRows;
  const int w0 = q0 + warp * 16;  // the warp's first query
  const int qi = warp * 16 + r;   // this lane's query within the tile
  const int row = q0 + qi;
  const int sk = r + 16 * h;  // column rotation, as in the forward
  const int64_t base = static_cast<int64_t>(blockIdx.x) * t * D;
  const int64_t row_base = static_cast<int64_t>(blockIdx.x) * t;
  load_tile_tc<D>(q + base, q0, t, qs);
  load_tile_tc<D>(grad_out + base, q0, t, dos);
  for (int i = threadIdx.x; i < kTcRows; i += kTcThreads) {
    lse_s[i] = q0 + i < t ? lse[row_base + q0 + i] * kLog2e : 0.0f;
    dvec_s[i] = q0 + i < t ? dvec[row_base + q0 + i] : 0.0f;
  }

  FragC dq[D / 16];
#pragma unroll
  for (int n = 0; n < D / 16; ++n) wmma::fill_fragment(dq[n], 0.0f);

  const int key_tiles = (min(q0 + kTcRows, t) - 1) / kTcCols + 1;
  for (int kt = 0; kt < key_tiles; ++kt) {
    const int k0 = kt * kTcCols;
    __syncthreads();  // everyone is done with the previous K and V (at kt = 0: Q, dO, statistics loaded)
    load_tile_tc<D>(k + base, k0, t, ks);
    load_tile_tc<D>(v + base, k0, t, vs);
    __syncthreads();
    const int n_vis = min(kTcCols / 16, (w0 + 15 - k0) / 16 + 1);
    for (int j = 0; j < n_vis; ++j) {
      FragC acc;
      product_abt<D>(acc, qs + warp * 16 * kLd, ks + j * 16 * kLd, kLd);  // Q K^T
      wmma::store_matrix_sync(s_w + j * 16, acc, L::kLdS, wmma::mem_row_major);
      product_abt<D>(acc, dos + warp * 16 * kLd, vs + j * 16 * kLd, kLd);  // dO V^T
      wmma::store_matrix_sync(dp_w + j * 16, acc, L::kLdS, wmma::mem_row_major);
    }
    __syncwarp();
#pragma unroll 8
    for (int c = 0; c < kHalfC; ++c) {
      const int col = h * kHalfC + ((c + sk) & (kHalfC - 1)), key = k0 + col;  // bank-skewed, see forward
      const bool visible = row < t && key <= row;                              // blocks j >= n_vis are all invisible
      const float p = visible ? exp2f(s_w[r * L::kLdS + col] * scale_log2 - lse_s[qi]) : 0.0f;
      const float ds = visible ? p * (dp_w[r * L::kLdS + col] - dvec_s[qi]) : 0.0f;
      ds_w[r * L::kLdP + col] = __float2bfloat16_rn(ds);
    }
    __syncwarp();
    // dQ += dS K over the visible key blocks.
    for (int kk = 0; kk < n_vis; ++kk) {
      FragA fs;
      wmma::load_matrix_sync(fs, ds_w + kk * 16, L::kLdP);
#pragma unroll
      for (int n = 0; n < D / 16; ++n) {
        FragB fb;
        wmma::load_matrix_sync(fb, ks + kk * 16 * kLd + n * 16, kLd);
        wmma::mma_sync(dq[n], fs, fb, dq[n]);
      }
    }
  }
  store_rows_tc<D>(dq, s_w, grad_q + base, w0, t, scale);
}

// Launches kernel<<<grid, threads, bytes>>> after opting in to `bytes` of dynamic shared memory.
template <class Kernel, class... Args>
void launch(Kernel kernel, dim3 grid, int threads, size_t bytes, cudaStream_t stream, Args... args) {
  DPT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
  kernel<<<grid, threads, bytes, stream>>>(args...);
  DPT_CUDA_CHECK_LAUNCH();
}

// bfloat16 runs on tensor cores when every tensor starts 16-byte aligned (the tile loads are 16-byte
// vectors), unless DPT_FLASH_IMPL=simt (or DPT_FLASH_SIMT=1) asks for the SIMT kernels (read per call,
// so a test can compare). Which tensor-core kernels: flash_impl_from_env (mma.sync unless wmma).
bool use_tensor_cores(DType dtype, std::initializer_list<const Tensor*> tensors) {
  if (dtype != DType::BFloat16) return false;
  if (flash_impl_from_env() == FlashImpl::kSimt) return false;
  for (const Tensor* t : tensors) {
    if (!aligned16(t->data_ptr())) return false;
  }
  return true;
}

// Calls f(element tag, std::integral_constant<int, D>) for the supported dtypes and head sizes.
template <class F>
void visit_flash(DType dtype, int64_t d, const char* what, F&& f) {
  auto with_d = [&](auto tag) {
    switch (d) {
      case 32:
        return f(tag, std::integral_constant<int, 32>{});
      case 64:
        return f(tag, std::integral_constant<int, 64>{});
      case 128:
        return f(tag, std::integral_constant<int, 128>{});
      default:
        DPT_FAIL("{} (CUDA): expected head size 32, 64 or 128, found {}", what, d);
    }
  };
  switch (dtype) {
    case DType::Float32:
      return with_d(float{});
    case DType::BFloat16:
      return with_d(bf16_t{});
    case DType::Float16:
      return with_d(f16_t{});  // SIMT kernels (use_tensor_cores is false for it)
    default:
      DPT_FAIL("{} (CUDA): expected float32, bfloat16 or float16, found {}", what, dtype_name(dtype));
  }
}

// The strided entry points run only the mma kernels: bfloat16 buffers, a head size they are built for, a
// positive scale and 16-byte aligned rows. Which kernels DPT_FLASH_IMPL selects is the caller's concern
// (flash_attention_strided_supported).
bool mma_runs_strided(DType dtype, int64_t d, double scale,
                      std::initializer_list<std::pair<const Tensor*, AttentionLayout>> operands) {
  if (dtype != DType::BFloat16 || !flash_mma_supports(d, scale)) return false;
  for (const auto& [buffer, layout] : operands) {
    if (buffer->dtype() != DType::BFloat16 || !flash_mma_operands_aligned({{buffer->data_ptr(), layout}})) return false;
  }
  return true;
}

dim3 flash_grid(int64_t bh, int64_t t, int tile, const char* what) {
  DPT_CHECK(bh <= 0x7fffffff && t <= 0x7fffffff / 2, "{} (CUDA): {} heads of length {} exceed the launch limits", what,
            bh, t);
  const int64_t tiles = (t + tile - 1) / tile;
  DPT_CHECK(tiles <= 65535, "{} (CUDA): sequence length {} needs {} tiles, more than 65535", what, t, tiles);
  return dim3(static_cast<unsigned>(bh), static_cast<unsigned>(tiles));
}

}  // namespace

void flash_attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                             int64_t bh, int64_t t, int64_t d, double scale) {
  if (bh == 0 || t == 0) return;
  const int device = device_of(out, {&q, &k, &v, &lse}, "flash_attention_forward");
  DPT_CHECK(lse.dtype() == DType::Float32, "flash_attention_forward (CUDA): expected float32 logsumexp, found {}",
            dtype_name(lse.dtype()));
  cudaStream_t stream = cuda::current_stream(device);
  const dim3 grid = flash_grid(bh, t, kBr, "flash_attention_forward");
  const float scale_log2 = static_cast<float>(scale) * kLog2e;
  const bool tc = use_tensor_cores(q.dtype(), {&q, &k, &v, &out});
  if (tc && flash_impl_from_env() == FlashImpl::kMma && flash_mma_supports(d, scale)) {
    flash_forward_mma(q.data<bf16_t>(), k.data<bf16_t>(), v.data<bf16_t>(), out.data<bf16_t>(), lse.data<float>(),
                      AttentionLayouts::contiguous(t, d), bh, t, d, scale_log2, stream);
    return;
  }
  visit_flash(q.dtype(), d, "flash_attention_forward", [&](auto tag, auto dim) {
    using T = decltype(tag);
    constexpr int D = decltype(dim)::value;
    if constexpr (std::is_same_v<T, bf16_t>) {
      if (tc) {
        launch(flash_forward_tc_kernel<D>, grid, kTcThreads, TcLayout<D>::kForwardBytes, stream, q.data<T>(),
               k.data<T>(), v.data<T>(), out.data<T>(), lse.data<float>(), static_cast<int>(t), scale_log2);
        return;
      }
    }
    launch(flash_forward_kernel<T, D>, grid, kFlashThreads, forward_smem_bytes<D>(), stream, q.data<T>(), k.data<T>(),
           v.data<T>(), out.data<T>(), lse.data<float>(), static_cast<int>(t), scale_log2);
  });
}

void flash_attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                              const Tensor& grad_out, const Tensor& lse, const Tensor& grad_q, const Tensor& grad_k,
                              const Tensor& grad_v, int64_t bh, int64_t t, int64_t d, double scale) {
  if (bh == 0 || t == 0) return;
  const int device =
      device_of(grad_q, {&q, &k, &v, &out, &grad_out, &lse, &grad_k, &grad_v}, "flash_attention_backward");
  DPT_CHECK(lse.dtype() == DType::Float32, "flash_attention_backward (CUDA): expected float32 logsumexp, found {}",
            dtype_name(lse.dtype()));
  cudaStream_t stream = cuda::current_stream(device);
  const dim3 q_grid = flash_grid(bh, t, kBr, "flash_attention_backward");
  const dim3 kv_grid = flash_grid(bh, t, kBc, "flash_attention_backward");
  const float scale_f = static_cast<float>(scale), scale_log2 = scale_f * kLog2e;
  const int64_t rows = bh * t;
  const bool tc = use_tensor_cores(q.dtype(), {&q, &k, &v, &out, &grad_out, &grad_q, &grad_k, &grad_v});
  if (tc && flash_impl_from_env() == FlashImpl::kMma && flash_mma_supports(d, scale)) {
    flash_backward_mma(q.data<bf16_t>(), k.data<bf16_t>(), v.data<bf16_t>(), out.data<bf16_t>(),
                       grad_out.data<bf16_t>(), lse.data<float>(), grad_q.data<bf16_t>(), grad_k.data<bf16_t>(),
                       grad_v.data<bf16_t>(), AttentionLayouts::contiguous(t, d), bh, t, d, scale_f, device, stream);
    return;
  }
  DeviceBuffer dvec(static_cast<size_t>(rows) * sizeof(float), device);
  visit_flash(q.dtype(), d, "flash_attention_backward", [&](auto tag, auto dim) {
    using T = decltype(tag);
    constexpr int D = decltype(dim)::value;
    constexpr int kRowsPerBlock = kFlashThreads / 32;
    flash_backward_dot_kernel<T, D>
        <<<static_cast<unsigned>((rows + kRowsPerBlock - 1) / kRowsPerBlock), kFlashThreads, 0, stream>>>(
            out.data<T>(), grad_out.data<T>(), dvec.as<float>(), rows);
    DPT_CUDA_CHECK_LAUNCH();
    const float* dv = dvec.as<float>();
    if constexpr (std::is_same_v<T, bf16_t>) {
      if (tc) {
        launch(flash_backward_kv_tc_kernel<D>, kv_grid, kTcThreads, TcLayout<D>::kBackwardKvBytes, stream, q.data<T>(),
               k.data<T>(), v.data<T>(), grad_out.data<T>(), lse.data<float>(), dv, grad_k.data<T>(), grad_v.data<T>(),
               static_cast<int>(t), scale_f, scale_log2);
        launch(flash_backward_q_tc_kernel<D>, q_grid, kTcThreads, TcLayout<D>::kBackwardQBytes, stream, q.data<T>(),
               k.data<T>(), v.data<T>(), grad_out.data<T>(), lse.data<float>(), dv, grad_q.data<T>(),
               static_cast<int>(t), scale_f, scale_log2);
        return;
      }
    }
    launch(flash_backward_kv_kernel<T, D>, kv_grid, kFlashThreads, backward_kv_smem_bytes<D>(), stream, q.data<T>(),
           k.data<T>(), v.data<T>(), grad_out.data<T>(), lse.data<float>(), dv, grad_k.data<T>(), grad_v.data<T>(),
           static_cast<int>(t), scale_f, scale_log2);
    launch(flash_backward_q_kernel<T, D>, q_grid, kFlashThreads, backward_q_smem_bytes<D>(), stream, q.data<T>(),
           k.data<T>(), v.data<T>(), grad_out.data<T>(), lse.data<float>(), dv, grad_q.data<T>(), static_cast<int>(t),
           scale_f, scale_log2);
  });
}

bool flash_attention_strided_supported(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                                       const AttentionLayouts& layouts, int64_t d, double scale) {
  return flash_impl_from_env() == FlashImpl::kMma &&
         mma_runs_strided(q.dtype(), d, scale,
                          {{&q, layouts.q}, {&k, layouts.k}, {&v, layouts.v}, {&out, layouts.out}});
}

void flash_attention_forward_strided(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                                     const Tensor& lse, const AttentionLayouts& layouts, int64_t bh, int64_t t,
                                     int64_t d, double scale, const AttentionDropout& dropout) {
  if (bh == 0 || t == 0) return;
  const int device = device_of(out, {&q, &k, &v, &lse}, "flash_attention_forward_strided");
  DPT_CHECK(lse.dtype() == DType::Float32,
            "flash_attention_forward_strided (CUDA): expected float32 logsumexp, found {}", dtype_name(lse.dtype()));
  DPT_CHECK(
      mma_runs_strided(q.dtype(), d, scale, {{&q, layouts.q}, {&k, layouts.k}, {&v, layouts.v}, {&out, layouts.out}}),
      "flash_attention_forward_strided (CUDA): expected bfloat16 with head size 32, 64 or 128, a positive "
      "scale and 16-byte aligned rows, found {}, head size {}, scale {}",
      dtype_name(q.dtype()), d, scale);
  flash_forward_mma(q.data<bf16_t>(), k.data<bf16_t>(), v.data<bf16_t>(), out.data<bf16_t>(), lse.data<float>(),
                    layouts, bh, t, d, static_cast<float>(scale) * kLog2e, cuda::current_stream(device), dropout);
}

void flash_attention_backward_strided(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                                      const Tensor& grad_out, const Tensor& lse, const Tensor& grad_q,
                                      const Tensor& grad_k, const Tensor& grad_v, const AttentionLayouts& layouts,
                                      int64_t bh, int64_t t, int64_t d, double scale, const Tensor& grad_sums,
                                      const AttentionDropout& dropout) {
  PackedColumnSums sums;
  if (grad_sums.defined()) {
    const int64_t heads = layouts.q.heads, c = heads * d;
    DPT_CHECK(grad_q.data_ptr() == grad_k.data_ptr() && grad_q.data_ptr() == grad_v.data_ptr() &&
                  layouts.q.row_stride == 3 * c && layouts.k.offset == c && layouts.v.offset == 2 * c &&
                  grad_sums.numel() == 3 * c && grad_sums.is_contiguous() &&
                  (grad_sums.dtype() == DType::Float32 || grad_sums.dtype() == DType::BFloat16),
              "flash_attention_backward_strided (CUDA): column sums need one packed [B, T, {}] gradient and a "
              "contiguous float32 or bfloat16 [{}] output, found {} {}",
              3 * c, 3 * c, shape_str(grad_sums.shape()), dtype_name(grad_sums.dtype()));
    sums = {grad_sums.data_ptr(), grad_sums.dtype() == DType::BFloat16, heads};
    if (bh == 0 || t == 0) {  // no rows: empty sums
      DPT_CUDA_CHECK(
          cudaMemsetAsync(grad_sums.data_ptr(), 0, grad_sums.nbytes(), cuda::current_stream(grad_sums.device().index)));
      return;
    }
  }
  if (bh == 0 || t == 0) return;
  const int device =
      device_of(grad_q, {&q, &k, &v, &out, &grad_out, &lse, &grad_k, &grad_v}, "flash_attention_backward_strided");
  DPT_CHECK(lse.dtype() == DType::Float32,
            "flash_attention_backward_strided (CUDA): expected float32 logsumexp, found {}", dtype_name(lse.dtype()));
  DPT_CHECK(mma_runs_strided(q.dtype(), d, scale,
                             {{&q, layouts.q},
                              {&k, layouts.k},
                              {&v, layouts.v},
                              {&out, layouts.out},
                              {&grad_out, layouts.out},
                              {&grad_q, layouts.q},
                              {&grad_k, layouts.k},
                              {&grad_v, layouts.v}}),
            "flash_attention_backward_strided (CUDA): expected bfloat16 with head size 32, 64 or 128, a positive "
            "scale and 16-byte aligned rows, found {}, head size {}, scale {}",
            dtype_name(q.dtype()), d, scale);
  flash_backward_mma(q.data<bf16_t>(), k.data<bf16_t>(), v.data<bf16_t>(), out.data<bf16_t>(), grad_out.data<bf16_t>(),
                     lse.data<float>(), grad_q.data<bf16_t>(), grad_k.data<bf16_t>(), grad_v.data<bf16_t>(), layouts,
                     bh, t, d, static_cast<float>(scale), device, cuda::current_stream(device), sums, dropout);
}

}  // namespace dpt::cuda_kernels
