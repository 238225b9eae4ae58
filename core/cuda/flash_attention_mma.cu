// bfloat16 fused causal attention on mma.sync.m16n8k16 (FlashAttention-2 algorithm, math in
// core/ops_flash_attention.h and the comment at the top of core/cuda/flash_attention.cu).
//
// Fragments (PTX ISA, mma.m16n8k16 with .bf16 inputs and .f32 accumulators; lane = 4 g + tq):
//   A 16 x 16 (row major), 4 registers of 2 bf16:  a0 (g, 2tq..+1)  a1 (g+8, 2tq..)  a2 (g, 8+2tq..)  a3 (g+8, 8+2tq..)
//   B 16 x 8 (k x n), 2 registers:                  b0 (k = 2tq..+1, n = g)          b1 (k = 8+2tq..+1, n = g)
//   C 16 x 8, 4 floats:                             c0, c1 (g, 2tq..+1)               c2, c3 (g+8, 2tq..+1)
// so the C fragments of two neighbouring 8-column blocks of S are exactly the A fragment of the
// 16-column block of P: softmax and the bf16 rounding of P (and of dS) happen in registers, and the
// row statistics of rows g and g+8 are reduced over the 4 lanes of a quad with two shuffles.
//
// Operands come from shared memory through ldmatrix.x4 (four 8 x 8 b16 matrices; lanes 8i..8i+7
// give the row addresses of matrix i, and matrix i lands in register i):
//   A from a row-major tile (Q, dO, K, V as the left operand):   row lane % 16, column 8 (lane / 16)
//   B = M^T from a row-major M [n][k] (K in Q K^T, Q in K Q^T):   row (lane % 8) + 8 (lane / 16),
//                                                                 column 8 ((lane / 8) % 2)
//   B = M from a row-major M [k][n] (V in P V, dO in P^T dO):     ldmatrix.trans, addressed like A
// Tiles are stored with rows padded to D + 8 elements: the 8 rows one 8 x 8 matrix reads are
// D + 8 elements = 16 (D / 8 + 1) bytes apart, so they fall in 8 different 16-byte bank groups (D / 8
// + 1 is odd), and ldmatrix and the 16-byte cp.async stores are free of bank conflicts.
//
// Kernels (W warps, each owning 16 rows of the block's tile; W = 4 by default). Variants for tuning,
// read per call (each measured slower at GPT-2 size on an H200, each covered by the tests):
// DPT_FLASH_MMA_WARPS=8 (D = 64: 128-row blocks), DPT_FLASH_MMA_FWD_M=2 (D <= 64: 32 query rows per
// warp in the forward), DPT_FLASH_MMA_BWD_HOLD=1 (D <= 64: backward fragments held in registers).
//   forward   grid (bh, query tiles of 16 W): Q fragments stay in registers; K and V tiles of 64 keys
//             stream through two cp.async stages (the next tile loads during this tile's math);
//             O, m, l live in the accumulator registers.
//   prep      one warp per row: dvec = dO . O and the logsumexp in log2 units, both padded with
//             (+inf, 0) to a multiple of 128 rows so the tiles below load them without bounds checks.
//   dK/dV     grid (bh, key tiles of 16 W): K and V fragments reloaded per tile, query tiles of
//             64 rows (Q, dO, lse, dvec) stream through two stages; per tile S^T = K Q^T, P^T,
//             dV += P^T dO, dP^T = V dO^T, dS^T = P^T (dP^T - dvec), dK += dS^T Q.
//   dQ        grid (bh, query tiles of 16 W): Q and dO fragments reloaded per tile, key tiles
//             stream; per tile S = Q K^T, P, dP = dO V^T, dS, dQ += dS K.
// Every output element is written once by one lane, which sums its terms in a fixed order: the results
// are bitwise reproducible. A warp skips the key (query) tiles that lie entirely on the masked side of
// its rows, and the 16-column blocks of the diagonal tile that do; only tiles crossing the diagonal
// apply the mask. Rows at or beyond t load as zeros and are never stored; their lse is +inf in the
// backward, so they contribute P = 0.
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "core/cuda/flash_attention_mma.cuh"
#include "core/error.h"

namespace dpt::cuda_kernels {

namespace {

constexpr int kKeyTile = 64;    // keys per streamed tile (forward, dQ)
constexpr int kQueryTile = 64;  // queries per streamed tile (dK/dV)
constexpr int kStatPad = 128;   // the padded statistics cover every tile of up to 128 rows
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes global -> shared without staging in registers; src_size 0 fills the 16 bytes with zeros.
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(dst)), "l"(src), "r"(valid ? 16 : 0)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const bf16_t* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(p)));
}
__device__ __forceinline__ void ldsm_x4_trans(uint32_t (&r)[4], const bf16_t* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(p)));
}

// c += A B for one 16 x 8 x 16 product.
__device__ __forceinline__ void mma_bf16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two floats rounded to bf16, `lo` in the low half (the lower column of an A fragment register).
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
  uint32_t u;
  std::memcpy(&u, &h, sizeof(u));
  return u;
}

// 2^x; 2^-inf = 0 (the masked scores).
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ float quad_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
  return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
__device__ __forceinline__ float quad_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

// Rows [first, first + ROWS) of a [t, D] matrix into dst[ROWS][D + 8] with cp.async; rows at or
// beyond t are zero-filled (their source address stays the matrix start, which is never read).
template <int D, int ROWS, int THREADS>
__device__ __forceinline__ void load_tile_async(const bf16_t* __restrict__ src, int first, int t, bf16_t* dst) {
  constexpr int kChunks = D / 8, kLd = D + 8;
  static_assert(ROWS * kChunks % THREADS == 0, "every thread copies the same number of chunks");
#pragma unroll
  for (int i = 0; i < ROWS * kChunks / THREADS; ++i) {
    const int e = static_cast<int>(threadIdx.x) + i * THREADS;
    const int r = e / kChunks, c = (e % kChunks) * 8;
    const int row = first + r;
    const bool valid = row < t;
    cp_async16(dst + r * kLd + c, src + (valid ? static_cast<int64_t>(row) * D + c : 0), valid);
  }
}

// A rows 16 x 16 at tile + row0 * ld + col0, as the lane addresses it (see the top).
__device__ __forceinline__ const bf16_t* a_addr(const bf16_t* tile, int row0, int col0, int ld, int lane) {
  return tile + (row0 + (lane & 15)) * ld + col0 + (lane >> 4) * 8;
}
// B = M^T for two 8-column blocks: M rows row0 .. row0 + 15 (the n index), columns col0 .. + 15 (k).
__device__ __forceinline__ const bf16_t* bt_addr(const bf16_t* tile, int row0, int col0, int ld, int lane) {
  return tile + (row0 + (lane & 7) + ((lane >> 4) << 3)) * ld + col0 + ((lane >> 3) & 1) * 8;
}

template <int D>
constexpr int kLdOf = D + 8;

template <int D, int W, int M>
constexpr size_t forward_bytes() {
  return sizeof(bf16_t) * static_cast<size_t>(16 * M * W + 4 * kKeyTile) * kLdOf<D>;
}
template <int D, int W>
constexpr size_t backward_kv_bytes() {
  return sizeof(bf16_t) * static_cast<size_t>(2 * 16 * W + 4 * kQueryTile) * kLdOf<D> + sizeof(float) * 4 * kQueryTile;
}
template <int D, int W>
constexpr size_t backward_q_bytes() {
  return sizeof(bf16_t) * static_cast<size_t>(2 * 16 * W + 4 * kKeyTile) * kLdOf<D>;
}

// ---------------------------------------------------------------------------------------------------
// Forward. grid (bh, query tiles of 16 M W), the heaviest query tiles (most keys) first. Each warp owns
// M 16-row blocks of queries (M = 2 loads every K and V fragment once for two row blocks: half the
// shared-memory traffic per product, at twice the accumulator registers).
template <int D, int W, int M>
__global__ void __launch_bounds__(32 * W)
    flash_forward_mma_kernel(const bf16_t* __restrict__ q, const bf16_t* __restrict__ k, const bf16_t* __restrict__ v,
                             bf16_t* __restrict__ out, float* __restrict__ lse, int t, float scale_log2) {
  constexpr int kThreads = 32 * W, kBr = 16 * M * W, kBc = kKeyTile, kLd = kLdOf<D>;
  constexpr int kTile = kBc * kLd;  // elements of one K or V stage
  constexpr int kKd = D / 16, kNd = D / 8, kNs = kBc / 8, kKs = kBc / 16;
  extern __shared__ __align__(128) unsigned char mma_smem[];
  bf16_t* qs = reinterpret_cast<bf16_t*>(mma_smem);  // [kBr][kLd]
  bf16_t* kv = qs + kBr * kLd;                       // stage s: K at kv + 2 s kTile, V after it
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3;
  const int q0 = (gridDim.y - 1 - blockIdx.y) * kBr;
  const int wq0 = q0 + 16 * M * warp;  // the warp's first query
  const int wq1 = wq0 + 16 * M - 1;    // and its last
  const int64_t base = static_cast<int64_t>(blockIdx.x) * t * D;
  const bf16_t* qh = q + base;
  const bf16_t* kh = k + base;
  const bf16_t* vh = v + base;
  const int n_tiles = (min(q0 + kBr, t) - 1) / kBc + 1;

  load_tile_async<D, kBr, kThreads>(qh, q0, t, qs);
  load_tile_async<D, kBc, kThreads>(kh, 0, t, kv);
  load_tile_async<D, kBc, kThreads>(vh, 0, t, kv + kTile);
  cp_async_commit();

  uint32_t qf[M][kKd][4];
  float o[M][kNd][4];
#pragma unroll
  for (int mi = 0; mi < M; ++mi) {
#pragma unroll
    for (int n = 0; n < kNd; ++n) o[mi][n][0] = o[mi][n][1] = o[mi][n][2] = o[mi][n][3] = 0.0f;
  }
  // Rows g and g + 8 of each row block: running max (log2 units, scaled) and this lane's part of the sum.
  float m[M][2], l[M][2];
#pragma unroll
  for (int mi = 0; mi < M; ++mi) {
    m[mi][0] = m[mi][1] = -INFINITY;
    l[mi][0] = l[mi][1] = 0.0f;
  }

  for (int kt = 0; kt < n_tiles; ++kt) {
    if (kt + 1 < n_tiles) {
      bf16_t* next = kv + ((kt + 1) & 1) * 2 * kTile;
      load_tile_async<D, kBc, kThreads>(kh, (kt + 1) * kBc, t, next);
      load_tile_async<D, kBc, kThreads>(vh, (kt + 1) * kBc, t, next + kTile);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    if (kt == 0) {
#pragma unroll
      for (int mi = 0; mi < M; ++mi) {
#pragma unroll
        for (int kk = 0; kk < kKd; ++kk) ldsm_x4(qf[mi][kk], a_addr(qs, 16 * (M * warp + mi), 16 * kk, kLd, lane));
      }
    }
    const int k0 = kt * kBc;
    const bf16_t* ks = kv + (kt & 1) * 2 * kTile;
    const bf16_t* vs = ks + kTile;
    // The warp sees at least one key of this tile (warp-uniform). Then k0 <= wq0 (both multiples of
    // 16 M), so every row of the warp sees key k0 and its running max is finite after this tile.
    if (k0 <= wq1) {
      const int n_kb = min(kKs, (wq1 - k0) / 16 + 1);  // 16-key blocks with a visible key
      float s[M][kNs][4];
#pragma unroll
      for (int mi = 0; mi < M; ++mi) {
#pragma unroll
        for (int j = 0; j < kNs; ++j) s[mi][j][0] = s[mi][j][1] = s[mi][j][2] = s[mi][j][3] = 0.0f;
      }
#pragma unroll
      for (int kk = 0; kk < kKd; ++kk) {
#pragma unroll
        for (int jb = 0; jb < kKs; ++jb) {
          if (jb < n_kb) {
            uint32_t b[4];
            ldsm_x4(b, bt_addr(ks, 16 * jb, 16 * kk, kLd, lane));
#pragma unroll
            for (int mi = 0; mi < M; ++mi) {
              mma_bf16(s[mi][2 * jb], qf[mi][kk], b[0], b[1]);
              mma_bf16(s[mi][2 * jb + 1], qf[mi][kk], b[2], b[3]);
            }
          }
        }
      }
      // Scale into log2 units; mask keys after the row where the tile crosses the warp's diagonal
      // (this also masks the skipped blocks j >= n_kb, whose keys all follow the warp's last row).
      const bool diag = k0 + kBc - 1 > wq0;
      uint32_t pf[M][kKs][4];
#pragma unroll
      for (int mi = 0; mi < M; ++mi) {
        const int r0 = wq0 + 16 * mi + g, r1 = r0 + 8;
        float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
        for (int j = 0; j < kNs; ++j) {
          const int c = k0 + 8 * j + 2 * tq;
#pragma unroll
          for (int e = 0; e < 4; ++e) s[mi][j][e] *= scale_log2;
          if (diag) {
            if (c > r0) s[mi][j][0] = -INFINITY;
            if (c + 1 > r0) s[mi][j][1] = -INFINITY;
            if (c > r1) s[mi][j][2] = -INFINITY;
            if (c + 1 > r1) s[mi][j][3] = -INFINITY;
          }
          mx0 = fmaxf(mx0, fmaxf(s[mi][j][0], s[mi][j][1]));
          mx1 = fmaxf(mx1, fmaxf(s[mi][j][2], s[mi][j][3]));
        }
        const float mn0 = fmaxf(m[mi][0], quad_max(mx0)), mn1 = fmaxf(m[mi][1], quad_max(mx1));
        const float alpha0 = fast_exp2(m[mi][0] - mn0), alpha1 = fast_exp2(m[mi][1] - mn1);
        m[mi][0] = mn0;
        m[mi][1] = mn1;
        float sum0 = 0.0f, sum1 = 0.0f;
#pragma unroll
        for (int n = 0; n < kNd; ++n) {
          o[mi][n][0] *= alpha0;
          o[mi][n][1] *= alpha0;
          o[mi][n][2] *= alpha1;
          o[mi][n][3] *= alpha1;
        }
#pragma unroll
        for (int j = 0; j < kNs; ++j) {
          const float p0 = fast_exp2(s[mi][j][0] - mn0), p1 = fast_exp2(s[mi][j][1] - mn0);
          const float p2 = fast_exp2(s[mi][j][2] - mn1), p3 = fast_exp2(s[mi][j][3] - mn1);
          sum0 += p0 + p1;
          sum1 += p2 + p3;
          pf[mi][j / 2][2 * (j & 1)] = pack_bf16(p0, p1);
          pf[mi][j / 2][2 * (j & 1) + 1] = pack_bf16(p2, p3);
        }
        l[mi][0] = l[mi][0] * alpha0 + sum0;
        l[mi][1] = l[mi][1] * alpha1 + sum1;
      }
#pragma unroll
      for (int kk = 0; kk < kKs; ++kk) {
        if (kk < n_kb) {
#pragma unroll
          for (int dn = 0; dn < D / 16; ++dn) {
            uint32_t b[4];
            ldsm_x4_trans(b, a_addr(vs, 16 * kk, 16 * dn, kLd, lane));
#pragma unroll
            for (int mi = 0; mi < M; ++mi) {
              mma_bf16(o[mi][2 * dn], pf[mi][kk], b[0], b[1]);
              mma_bf16(o[mi][2 * dn + 1], pf[mi][kk], b[2], b[3]);
            }
          }
        }
      }
    }
    __syncthreads();  // everyone is done with this stage before the next iteration refills it
  }

  float* lse_h = lse + static_cast<int64_t>(blockIdx.x) * t;
#pragma unroll
  for (int mi = 0; mi < M; ++mi) {
    const int r0 = wq0 + 16 * mi + g, r1 = r0 + 8;
    const float l0 = quad_sum(l[mi][0]), l1 = quad_sum(l[mi][1]);
    const float inv0 = 1.0f / l0, inv1 = 1.0f / l1;
#pragma unroll
    for (int n = 0; n < kNd; ++n) {
      const int c = 8 * n + 2 * tq;
      if (r0 < t)
        *reinterpret_cast<__nv_bfloat162*>(out + base + static_cast<int64_t>(r0) * D + c) =
            __floats2bfloat162_rn(o[mi][n][0] * inv0, o[mi][n][1] * inv0);
      if (r1 < t)
        *reinterpret_cast<__nv_bfloat162*>(out + base + static_cast<int64_t>(r1) * D + c) =
            __floats2bfloat162_rn(o[mi][n][2] * inv1, o[mi][n][3] * inv1);
    }
    if (tq == 0) {
      if (r0 < t) lse_h[r0] = (m[mi][0] + log2f(l0)) * kLn2;
      if (r1 < t) lse_h[r1] = (m[mi][1] + log2f(l1)) * kLn2;
    }
  }
}

// ---------------------------------------------------------------------------------------------------
// Backward statistics, one warp per padded row: lse2 = lse log2(e) (+inf past t), dvec = dO . O (0).
template <int D>
__global__ void flash_backward_prep_kernel(const bf16_t* __restrict__ out, const bf16_t* __restrict__ grad_out,
                                           const float* __restrict__ lse, float* __restrict__ lse2,
                                           float* __restrict__ dvec, int t, int t_pad, int64_t rows_pad) {
  const int lane = threadIdx.x & 31;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  if (row >= rows_pad) return;
  const int64_t head = row / t_pad;
  const int r = static_cast<int>(row - head * t_pad);
  if (r >= t) {
    if (lane == 0) {
      lse2[row] = INFINITY;
      dvec[row] = 0.0f;
    }
    return;
  }
  const int64_t at = (head * t + r) * D;
  float s = 0.0f;
#pragma unroll
  for (int c = lane; c < D; c += 32) s += __bfloat162float(grad_out[at + c]) * __bfloat162float(out[at + c]);
  s = warp_sum(s);
  if (lane == 0) {
    dvec[row] = s;
    lse2[row] = lse[head * t + r] * kLog2e;
  }
}

// ---------------------------------------------------------------------------------------------------
// dK, dV. grid (bh, key tiles of 16 W); key tile 0 sees every query, so it is scheduled first.
template <int D, int W, bool H>
__global__ void __launch_bounds__(32 * W, D <= 64 && W == 4 && !H ? 3 : 1)
    flash_backward_kv_mma_kernel(const bf16_t* __restrict__ q, const bf16_t* __restrict__ k,
                                 const bf16_t* __restrict__ v, const bf16_t* __restrict__ grad_out,
                                 const float* __restrict__ lse2, const float* __restrict__ dvec,
                                 bf16_t* __restrict__ grad_k, bf16_t* __restrict__ grad_v, int t, int t_pad,
                                 float scale, float scale_log2) {
  constexpr int kThreads = 32 * W, kBc = 16 * W, kBr = kQueryTile, kLd = kLdOf<D>;
  constexpr int kTile = kBr * kLd;
  constexpr int kKd = D / 16, kNd = D / 8, kNs = kBr / 8, kKs = kBr / 16;
  constexpr bool kHold = H;  // K, V fragments in registers (never at D = 128: they would spill)
  extern __shared__ __align__(128) unsigned char mma_smem[];
  bf16_t* ks = reinterpret_cast<bf16_t*>(mma_smem);         // [kBc][kLd]
  bf16_t* vs = ks + kBc * kLd;                              // [kBc][kLd]
  bf16_t* qd = vs + kBc * kLd;                              // stage s: Q at qd + 2 s kTile, dO after it
  float* stats = reinterpret_cast<float*>(qd + 4 * kTile);  // stage s: lse2 [64] at 2 s kBr, dvec after it
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3;
  const int k0 = blockIdx.y * kBc;
  const int wk0 = k0 + 16 * warp;  // the warp's first key
  const int64_t base = static_cast<int64_t>(blockIdx.x) * t * D;
  const int64_t sbase = static_cast<int64_t>(blockIdx.x) * t_pad;
  const bf16_t* qh = q + base;
  const bf16_t* doh = grad_out + base;
  const int qt0 = k0 / kBr, n_qt = (t + kBr - 1) / kBr;

  auto load_stage = [&](int qt, int stage) {
    bf16_t* dst = qd + stage * 2 * kTile;
    load_tile_async<D, kBr, kThreads>(qh, qt * kBr, t, dst);
    load_tile_async<D, kBr, kThreads>(doh, qt * kBr, t, dst + kTile);
    // 2 x 64 floats = 32 chunks of 16 bytes; the padded statistics need no bounds check.
    if (threadIdx.x < 2 * kBr / 4) {
      const int which = threadIdx.x / (kBr / 4), c = (threadIdx.x % (kBr / 4)) * 4;
      const float* src = (which == 0 ? lse2 : dvec) + sbase + qt * kBr + c;
      cp_async16(stats + (2 * stage + which) * kBr + c, src, true);
    }
  };
  load_tile_async<D, kBc, kThreads>(k + base, k0, t, ks);
  load_tile_async<D, kBc, kThreads>(v + base, k0, t, vs);
  load_stage(qt0, 0);
  cp_async_commit();

  uint32_t kf[kHold ? kKd : 1][4], vf[kHold ? kKd : 1][4];
  float dka[kNd][4], dva[kNd][4];
#pragma unroll
  for (int n = 0; n < kNd; ++n) {
#pragma unroll
    for (int e = 0; e < 4; ++e) dka[n][e] = dva[n][e] = 0.0f;
  }
  const int kr0 = wk0 + g, kr1 = kr0 + 8;  // this lane's keys

  for (int qt = qt0; qt < n_qt; ++qt) {
    const int stage = (qt - qt0) & 1;
    if (qt + 1 < n_qt) {
      load_stage(qt + 1, stage ^ 1);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    if constexpr (kHold) {
      if (qt == qt0) {
#pragma unroll
        for (int kk = 0; kk < kKd; ++kk) {
          ldsm_x4(kf[kk], a_addr(ks, 16 * warp, 16 * kk, kLd, lane));
          ldsm_x4(vf[kk], a_addr(vs, 16 * warp, 16 * kk, kLd, lane));
        }
      }
    }
    const int q0 = qt * kBr;
    const bf16_t* qs = qd + stage * 2 * kTile;
    const bf16_t* dos = qs + kTile;
    const float* lse_s = stats + 2 * stage * kBr;
    const float* dvec_s = lse_s + kBr;
    if (q0 + kBr - 1 >= wk0) {                          // some query of the tile sees a key of the warp (warp-uniform)
      const int jb0 = q0 >= wk0 ? 0 : (wk0 - q0) / 16;  // 16-query blocks before it see none
      const bool diag = q0 < wk0 + 15;
      // S^T = K Q^T (keys x queries), then P^T in place.
      float p[kNs][4];
#pragma unroll
      for (int j = 0; j < kNs; ++j) p[j][0] = p[j][1] = p[j][2] = p[j][3] = 0.0f;
#pragma unroll
      for (int kk = 0; kk < kKd; ++kk) {
        uint32_t a[4];
        if constexpr (kHold) {
#pragma unroll
          for (int e = 0; e < 4; ++e) a[e] = kf[kk][e];
        } else {
          ldsm_x4(a, a_addr(ks, 16 * warp, 16 * kk, kLd, lane));
        }
#pragma unroll
        for (int jb = 0; jb < kKs; ++jb) {
          if (jb >= jb0) {
            uint32_t b[4];
            ldsm_x4(b, bt_addr(qs, 16 * jb, 16 * kk, kLd, lane));
            mma_bf16(p[2 * jb], a, b[0], b[1]);
            mma_bf16(p[2 * jb + 1], a, b[2], b[3]);
          }
        }
      }
      uint32_t pf[kKs][4];
#pragma unroll
      for (int j = 0; j < kNs; ++j) {
        const int c = 8 * j + 2 * tq;  // the lane's queries q0 + c, q0 + c + 1
        const float2 lq = *reinterpret_cast<const float2*>(lse_s + c);
        p[j][0] = fast_exp2(p[j][0] * scale_log2 - lq.x);
        p[j][1] = fast_exp2(p[j][1] * scale_log2 - lq.y);
        p[j][2] = fast_exp2(p[j][2] * scale_log2 - lq.x);
        p[j][3] = fast_exp2(p[j][3] * scale_log2 - lq.y);
        if (diag) {  // query before key: invisible (covers the skipped blocks j < 2 jb0 too)
          const int qc = q0 + c;
          if (qc < kr0) p[j][0] = 0.0f;
          if (qc + 1 < kr0) p[j][1] = 0.0f;
          if (qc < kr1) p[j][2] = 0.0f;
          if (qc + 1 < kr1) p[j][3] = 0.0f;
        }
        pf[j / 2][2 * (j & 1)] = pack_bf16(p[j][0], p[j][1]);
        pf[j / 2][2 * (j & 1) + 1] = pack_bf16(p[j][2], p[j][3]);
      }
      // dV += P^T dO.
#pragma unroll
      for (int kk = 0; kk < kKs; ++kk) {
        if (kk >= jb0) {
#pragma unroll
          for (int dn = 0; dn < D / 16; ++dn) {
            uint32_t b[4];
            ldsm_x4_trans(b, a_addr(dos, 16 * kk, 16 * dn, kLd, lane));
            mma_bf16(dva[2 * dn], pf[kk], b[0], b[1]);
            mma_bf16(dva[2 * dn + 1], pf[kk], b[2], b[3]);
          }
        }
      }
      // dP^T = V dO^T.
      float dp[kNs][4];
#pragma unroll
      for (int j = 0; j < kNs; ++j) dp[j][0] = dp[j][1] = dp[j][2] = dp[j][3] = 0.0f;
#pragma unroll
      for (int kk = 0; kk < kKd; ++kk) {
        uint32_t a[4];
        if constexpr (kHold) {
#pragma unroll
          for (int e = 0; e < 4; ++e) a[e] = vf[kk][e];
        } else {
          ldsm_x4(a, a_addr(vs, 16 * warp, 16 * kk, kLd, lane));
        }
#pragma unroll
        for (int jb = 0; jb < kKs; ++jb) {
          if (jb >= jb0) {
            uint32_t b[4];
            ldsm_x4(b, bt_addr(dos, 16 * jb, 16 * kk, kLd, lane));
            mma_bf16(dp[2 * jb], a, b[0], b[1]);
            mma_bf16(dp[2 * jb + 1], a, b[2], b[3]);
          }
        }
      }
      // dS^T = P^T (dP^T - dvec), rounded to bf16 as the A operand of dK += dS^T Q.
#pragma unroll
      for (int j = 0; j < kNs; ++j) {
        const float2 dv2 = *reinterpret_cast<const float2*>(dvec_s + 8 * j + 2 * tq);
        pf[j / 2][2 * (j & 1)] = pack_bf16(p[j][0] * (dp[j][0] - dv2.x), p[j][1] * (dp[j][1] - dv2.y));
        pf[j / 2][2 * (j & 1) + 1] = pack_bf16(p[j][2] * (dp[j][2] - dv2.x), p[j][3] * (dp[j][3] - dv2.y));
      }
#pragma unroll
      for (int kk = 0; kk < kKs; ++kk) {
        if (kk >= jb0) {
#pragma unroll
          for (int dn = 0; dn < D / 16; ++dn) {
            uint32_t b[4];
            ldsm_x4_trans(b, a_addr(qs, 16 * kk, 16 * dn, kLd, lane));
            mma_bf16(dka[2 * dn], pf[kk], b[0], b[1]);
            mma_bf16(dka[2 * dn + 1], pf[kk], b[2], b[3]);
          }
        }
      }
    }
    __syncthreads();  // everyone is done with this stage before the next iteration refills it
  }

#pragma unroll
  for (int n = 0; n < kNd; ++n) {
    const int c = 8 * n + 2 * tq;
    if (kr0 < t) {
      const int64_t at = base + static_cast<int64_t>(kr0) * D + c;
      *reinterpret_cast<__nv_bfloat162*>(grad_v + at) = __floats2bfloat162_rn(dva[n][0], dva[n][1]);
      *reinterpret_cast<__nv_bfloat162*>(grad_k + at) = __floats2bfloat162_rn(dka[n][0] * scale, dka[n][1] * scale);
    }
    if (kr1 < t) {
      const int64_t at = base + static_cast<int64_t>(kr1) * D + c;
      *reinterpret_cast<__nv_bfloat162*>(grad_v + at) = __floats2bfloat162_rn(dva[n][2], dva[n][3]);
      *reinterpret_cast<__nv_bfloat162*>(grad_k + at) = __floats2bfloat162_rn(dka[n][2] * scale, dka[n][3] * scale);
    }
  }
}

// ---------------------------------------------------------------------------------------------------
// dQ. grid (bh, query tiles of 16 W), the heaviest query tiles first.
template <int D, int W, bool H>
__global__ void __launch_bounds__(32 * W, D <= 64 && W == 4 ? 3 : 1)
    flash_backward_q_mma_kernel(const bf16_t* __restrict__ q, const bf16_t* __restrict__ k,
                                const bf16_t* __restrict__ v, const bf16_t* __restrict__ grad_out,
                                const float* __restrict__ lse2, const float* __restrict__ dvec,
                                bf16_t* __restrict__ grad_q, int t, int t_pad, float scale, float scale_log2) {
  constexpr int kThreads = 32 * W, kBr = 16 * W, kBc = kKeyTile, kLd = kLdOf<D>;
  constexpr int kTile = kBc * kLd;
  constexpr int kKd = D / 16, kNd = D / 8, kNs = kBc / 8, kKs = kBc / 16;
  constexpr bool kHold = H;  // Q, dO fragments in registers
  extern __shared__ __align__(128) unsigned char mma_smem[];
  bf16_t* qs = reinterpret_cast<bf16_t*>(mma_smem);  // [kBr][kLd]
  bf16_t* dos = qs + kBr * kLd;                      // [kBr][kLd]
  bf16_t* kv = dos + kBr * kLd;                      // stage s: K at kv + 2 s kTile, V after it
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3;
  const int q0 = (gridDim.y - 1 - blockIdx.y) * kBr;
  const int wq0 = q0 + 16 * warp;
  const int64_t base = static_cast<int64_t>(blockIdx.x) * t * D;
  const bf16_t* kh = k + base;
  const bf16_t* vh = v + base;
  const int n_tiles = (min(q0 + kBr, t) - 1) / kBc + 1;
  const int r0 = wq0 + g, r1 = r0 + 8;
  // Rows past t read the padding (+inf, 0): P = 0 there. t_pad is a multiple of 128 >= kBr.
  const int64_t sbase = static_cast<int64_t>(blockIdx.x) * t_pad;
  const float lse0 = lse2[sbase + r0], lse1 = lse2[sbase + r1];
  const float dvec0 = dvec[sbase + r0], dvec1 = dvec[sbase + r1];

  load_tile_async<D, kBr, kThreads>(q + base, q0, t, qs);
  load_tile_async<D, kBr, kThreads>(grad_out + base, q0, t, dos);
  load_tile_async<D, kBc, kThreads>(kh, 0, t, kv);
  load_tile_async<D, kBc, kThreads>(vh, 0, t, kv + kTile);
  cp_async_commit();

  uint32_t qf[kHold ? kKd : 1][4], of[kHold ? kKd : 1][4];
  float dqa[kNd][4];
#pragma unroll
  for (int n = 0; n < kNd; ++n) dqa[n][0] = dqa[n][1] = dqa[n][2] = dqa[n][3] = 0.0f;

  for (int kt = 0; kt < n_tiles; ++kt) {
    if (kt + 1 < n_tiles) {
      bf16_t* next = kv + ((kt + 1) & 1) * 2 * kTile;
      load_tile_async<D, kBc, kThreads>(kh, (kt + 1) * kBc, t, next);
      load_tile_async<D, kBc, kThreads>(vh, (kt + 1) * kBc, t, next + kTile);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    if constexpr (kHold) {
      if (kt == 0) {
#pragma unroll
        for (int kk = 0; kk < kKd; ++kk) {
          ldsm_x4(qf[kk], a_addr(qs, 16 * warp, 16 * kk, kLd, lane));
          ldsm_x4(of[kk], a_addr(dos, 16 * warp, 16 * kk, kLd, lane));
        }
      }
    }
    const int k0 = kt * kBc;
    const bf16_t* ks = kv + (kt & 1) * 2 * kTile;
    const bf16_t* vs = ks + kTile;
    if (k0 <= wq0 + 15) {
      const int n_kb = min(kKs, (wq0 + 15 - k0) / 16 + 1);
      const bool diag = k0 + kBc - 1 > wq0;
      float p[kNs][4], dp[kNs][4];
#pragma unroll
      for (int j = 0; j < kNs; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) p[j][e] = dp[j][e] = 0.0f;
      }
#pragma unroll
      for (int kk = 0; kk < kKd; ++kk) {
        uint32_t a[4], ao[4];
        if constexpr (kHold) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            a[e] = qf[kk][e];
            ao[e] = of[kk][e];
          }
        } else {
          ldsm_x4(a, a_addr(qs, 16 * warp, 16 * kk, kLd, lane));
          ldsm_x4(ao, a_addr(dos, 16 * warp, 16 * kk, kLd, lane));
        }
#pragma unroll
        for (int jb = 0; jb < kKs; ++jb) {
          if (jb < n_kb) {
            uint32_t b[4];
            ldsm_x4(b, bt_addr(ks, 16 * jb, 16 * kk, kLd, lane));
            mma_bf16(p[2 * jb], a, b[0], b[1]);
            mma_bf16(p[2 * jb + 1], a, b[2], b[3]);
            ldsm_x4(b, bt_addr(vs, 16 * jb, 16 * kk, kLd, lane));
            mma_bf16(dp[2 * jb], ao, b[0], b[1]);
            mma_bf16(dp[2 * jb + 1], ao, b[2], b[3]);
          }
        }
      }
      uint32_t dsf[kKs][4];
#pragma unroll
      for (int j = 0; j < kNs; ++j) {
        const int c = k0 + 8 * j + 2 * tq;
        p[j][0] = fast_exp2(p[j][0] * scale_log2 - lse0);
        p[j][1] = fast_exp2(p[j][1] * scale_log2 - lse0);
        p[j][2] = fast_exp2(p[j][2] * scale_log2 - lse1);
        p[j][3] = fast_exp2(p[j][3] * scale_log2 - lse1);
        if (diag) {  // key after the row: invisible (covers the skipped blocks j >= 2 n_kb too)
          if (c > r0) p[j][0] = 0.0f;
          if (c + 1 > r0) p[j][1] = 0.0f;
          if (c > r1) p[j][2] = 0.0f;
          if (c + 1 > r1) p[j][3] = 0.0f;
        }
        dsf[j / 2][2 * (j & 1)] = pack_bf16(p[j][0] * (dp[j][0] - dvec0), p[j][1] * (dp[j][1] - dvec0));
        dsf[j / 2][2 * (j & 1) + 1] = pack_bf16(p[j][2] * (dp[j][2] - dvec1), p[j][3] * (dp[j][3] - dvec1));
      }
      // dQ += dS K.
#pragma unroll
      for (int kk = 0; kk < kKs; ++kk) {
        if (kk < n_kb) {
#pragma unroll
          for (int dn = 0; dn < D / 16; ++dn) {
            uint32_t b[4];
            ldsm_x4_trans(b, a_addr(ks, 16 * kk, 16 * dn, kLd, lane));
            mma_bf16(dqa[2 * dn], dsf[kk], b[0], b[1]);
            mma_bf16(dqa[2 * dn + 1], dsf[kk], b[2], b[3]);
          }
        }
      }
    }
    __syncthreads();
  }

#pragma unroll
  for (int n = 0; n < kNd; ++n) {
    const int c = 8 * n + 2 * tq;
    if (r0 < t)
      *reinterpret_cast<__nv_bfloat162*>(grad_q + base + static_cast<int64_t>(r0) * D + c) =
          __floats2bfloat162_rn(dqa[n][0] * scale, dqa[n][1] * scale);
    if (r1 < t)
      *reinterpret_cast<__nv_bfloat162*>(grad_q + base + static_cast<int64_t>(r1) * D + c) =
          __floats2bfloat162_rn(dqa[n][2] * scale, dqa[n][3] * scale);
  }
}

// ---------------------------------------------------------------------------------------------------

template <class Kernel, class... Args>
void launch(Kernel kernel, dim3 grid, int threads, size_t bytes, cudaStream_t stream, Args... args) {
  DPT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
  kernel<<<grid, threads, bytes, stream>>>(args...);
  DPT_CUDA_CHECK_LAUNCH();
}

dim3 mma_grid(int64_t bh, int64_t t, int rows, const char* what) {
  DPT_CHECK(bh <= 0x7fffffff && t <= 0x7fffffff / 2, "{} (CUDA): {} heads of length {} exceed the launch limits", what,
            bh, t);
  const int64_t tiles = (t + rows - 1) / rows;
  DPT_CHECK(tiles <= 65535, "{} (CUDA): sequence length {} needs {} tiles, more than 65535", what, t, tiles);
  return dim3(static_cast<unsigned>(bh), static_cast<unsigned>(tiles));
}

// Warps per block: 4 (64-row tiles); DPT_FLASH_MMA_WARPS=8 selects 128-row tiles at D = 64, for tuning.
int mma_warps(int64_t d) {
  const char* w = std::getenv("DPT_FLASH_MMA_WARPS");
  return d == 64 && w != nullptr && std::strcmp(w, "8") == 0 ? 8 : 4;
}

// 16-row blocks per warp in the forward: 1, or 2 with DPT_FLASH_MMA_FWD_M=2 (D <= 64, 4 warps).
int forward_row_blocks() {
  const char* m = std::getenv("DPT_FLASH_MMA_FWD_M");
  return m != nullptr && std::strcmp(m, "2") == 0 ? 2 : 1;
}

// Whether the backward kernels keep their own rows' fragments (K, V or Q, dO) in registers for the
// whole loop. By default they reload them from shared memory every tile: 8 more ldmatrix per 128 (dK/dV)
// or 96 (dQ) products buys 40 fewer registers, 3 resident blocks instead of 2, and measured 10% less
// time at GPT-2 size on an H200. DPT_FLASH_MMA_BWD_HOLD=1 keeps them (D <= 64), for comparison.
bool backward_holds_fragments() {
  const char* h = std::getenv("DPT_FLASH_MMA_BWD_HOLD");
  return h != nullptr && std::strcmp(h, "1") == 0;
}

// Calls f(std::integral_constant<int, D>, std::integral_constant<int, W>).
template <class F>
void visit_mma(int64_t d, const char* what, F&& f) {
  using std::integral_constant;
  switch (d) {
    case 32:
      return f(integral_constant<int, 32>{}, integral_constant<int, 4>{});
    case 64:
      if (mma_warps(d) == 8) return f(integral_constant<int, 64>{}, integral_constant<int, 8>{});
      return f(integral_constant<int, 64>{}, integral_constant<int, 4>{});
    case 128:
      return f(integral_constant<int, 128>{}, integral_constant<int, 4>{});
    default:
      DPT_FAIL("{} (CUDA): expected head size 32, 64 or 128, found {}", what, d);
  }
}

}  // namespace

FlashImpl flash_impl_from_env() {
  const char* simt = std::getenv("DPT_FLASH_SIMT");
  if (simt != nullptr && std::strcmp(simt, "1") == 0) return FlashImpl::kSimt;
  const char* impl = std::getenv("DPT_FLASH_IMPL");
  if (impl == nullptr || *impl == '\0' || std::strcmp(impl, "mma") == 0) return FlashImpl::kMma;
  if (std::strcmp(impl, "wmma") == 0) return FlashImpl::kWmma;
  if (std::strcmp(impl, "simt") == 0) return FlashImpl::kSimt;
  DPT_FAIL("DPT_FLASH_IMPL: expected mma, wmma or simt, found '{}'", impl);
}

const char* flash_impl_name(FlashImpl impl) {
  switch (impl) {
    case FlashImpl::kMma:
      return "mma";
    case FlashImpl::kWmma:
      return "wmma";
    case FlashImpl::kSimt:
      return "simt";
  }
  return "?";
}

bool flash_mma_supports(int64_t d) { return d == 32 || d == 64 || d == 128; }

void flash_forward_mma(const bf16_t* q, const bf16_t* k, const bf16_t* v, bf16_t* out, float* lse, int64_t bh,
                       int64_t t, int64_t d, float scale_log2, cudaStream_t stream) {
  visit_mma(d, "flash_attention_forward", [&](auto dim, auto warps) {
    constexpr int D = decltype(dim)::value, W = decltype(warps)::value;
    auto run = [&](auto blocks) {
      constexpr int M = decltype(blocks)::value;
      launch(flash_forward_mma_kernel<D, W, M>, mma_grid(bh, t, 16 * M * W, "flash_attention_forward"), 32 * W,
             forward_bytes<D, W, M>(), stream, q, k, v, out, lse, static_cast<int>(t), scale_log2);
    };
    // Two row blocks per warp where the accumulators fit in registers (D <= 64, 4 warps).
    if constexpr (D <= 64 && W == 4) {
      if (forward_row_blocks() == 2) return run(std::integral_constant<int, 2>{});
    }
    run(std::integral_constant<int, 1>{});
  });
}

void flash_backward_mma(const bf16_t* q, const bf16_t* k, const bf16_t* v, const bf16_t* out, const bf16_t* grad_out,
                        const float* lse, bf16_t* grad_q, bf16_t* grad_k, bf16_t* grad_v, int64_t bh, int64_t t,
                        int64_t d, float scale, int device, cudaStream_t stream) {
  const int64_t t_pad = (t + kStatPad - 1) / kStatPad * kStatPad;
  const int64_t rows_pad = bh * t_pad;
  DeviceBuffer stats(2 * static_cast<size_t>(rows_pad) * sizeof(float), device);
  float* lse2 = stats.as<float>();
  float* dvec = lse2 + rows_pad;
  const float scale_log2 = scale * kLog2e;
  visit_mma(d, "flash_attention_backward", [&](auto dim, auto warps) {
    constexpr int D = decltype(dim)::value, W = decltype(warps)::value;
    constexpr int kRowsPerBlock = 8;
    flash_backward_prep_kernel<D>
        <<<static_cast<unsigned>((rows_pad + kRowsPerBlock - 1) / kRowsPerBlock), 32 * kRowsPerBlock, 0, stream>>>(
            out, grad_out, lse, lse2, dvec, static_cast<int>(t), static_cast<int>(t_pad), rows_pad);
    DPT_CUDA_CHECK_LAUNCH();
    auto run = [&](auto hold) {
      constexpr bool H = decltype(hold)::value;
      launch(flash_backward_kv_mma_kernel<D, W, H>, mma_grid(bh, t, 16 * W, "flash_attention_backward"), 32 * W,
             backward_kv_bytes<D, W>(), stream, q, k, v, grad_out, static_cast<const float*>(lse2),
             static_cast<const float*>(dvec), grad_k, grad_v, static_cast<int>(t), static_cast<int>(t_pad), scale,
             scale_log2);
      launch(flash_backward_q_mma_kernel<D, W, H>, mma_grid(bh, t, 16 * W, "flash_attention_backward"), 32 * W,
             backward_q_bytes<D, W>(), stream, q, k, v, grad_out, static_cast<const float*>(lse2),
             static_cast<const float*>(dvec), grad_q, static_cast<int>(t), static_cast<int>(t_pad), scale, scale_log2);
    };
    if constexpr (D <= 64) {
      if (backward_holds_fragments()) return run(std::true_type{});
    }
    run(std::false_type{});
  });
}

}  // namespace dpt::cuda_kernels
