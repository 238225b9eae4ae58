// bfloat16 fused causal attention on mma.sync.m16n8k16: the FlashAttention-2 algorithm (math in
// core/ops_flash_attention.h), our CUDA kernels for causal_attention and causal_attention_qkv.
//
// Algorithm. Per (head, tile of queries) the forward streams the key/value tiles 0..diagonal through
// shared memory (tiles entirely above the diagonal are never loaded) and keeps, per query row, the running
// maximum m (log2 units), the running sum l and the unnormalised output O in registers:
//   S = scale log2(e) Q K^T (masked),  m' = max(m, rowmax S),  P = 2^(S - m'),
//   l = l 2^(m - m') + rowsum P,       O = O 2^(m - m') + P V,
// and at the end writes O / l once, and lse = (m + log2 l) ln 2 (natural units) for the backward. The
// backward recomputes P = exp(scale Q K^T - lse) tile by tile instead of storing it, in two kernels
// (below): one owns query rows and forms dQ, the other owns key rows and forms dK and dV, so no output is
// summed by two blocks and no atomics are needed.
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
// Each lane's offset within a tile is computed once; every fragment address is then a tile base plus
// a compile-time constant. Tiles are stored with rows padded to D + 8 elements: the 8 rows one 8 x 8
// matrix reads are D + 8 elements = 16 (D / 8 + 1) bytes apart, so they fall in 8 different 16-byte
// bank groups (D / 8 + 1 is odd), and ldmatrix and the 16-byte cp.async stores are free of bank
// conflicts.
//
// Operands are addressed through an AttentionLayout (core/attention_layout.h): block (bh, .) finds its
// head at layout.head_start(bh) and row r at r row_stride from there, so the same kernels read a
// contiguous [bh, t, d] tensor or the heads of a packed [B, T, 3C] QKV projection in place, and write the
// output (and the gradients) in the caller's layout. Only the addressing differs: the arithmetic, and so
// the bits of every result, are the same for every layout. Row starts must be 16-byte aligned (the host
// checks flash_mma_operands_aligned) because the tile loads are 16-byte cp.async vectors.
//
// Kernels (W = 4 warps per block, each owning 16 rows of the block's 64-row tile):
//   forward   grid (bh, query tiles of 16 W): Q fragments stay in registers; K and V tiles of 64 keys
//             stream through two cp.async stages (the next tile loads during this tile's math);
//             O, m, l live in the accumulator registers. The positive scale is folded into the
//             exponent: the row maximum is taken on the raw scores and scaled once (max(s) scale =
//             max(s scale)), and p = 2^(s scale log2(e) - m') is one FFMA + EX2.
//   dQ        runs first. grid (bh, query tiles of 16 W): loads its rows of Q, dO and O, computes
//             their statistics (dvec = dO . O, two threads per row, and the logsumexp in log2 units) and
//             writes them for the dK/dV kernel, so no separate pass reads O and dO again; then key tiles
//             stream; per tile S = Q K^T, P, dP = dO V^T, dS, dQ += dS K.
//   dK/dV     grid (bh, key tiles of 16 W): query tiles of 64 rows (Q, dO, and the statistics, which
//             the dQ blocks wrote for every row of their tiles, padded rows as (+inf, 0), so they load
//             without bounds checks) stream through two stages; per tile S^T = K Q^T, P^T,
//             dV += P^T dO, dP^T = V dO^T, dS^T = P^T (dP^T - dvec), dK += dS^T Q.
// Given col_part, both backward kernels also sum the columns of the rows they store (the QKV projection's
// bias gradient, core/grad_column_sums.h): one partial row per block, in a fixed order, added up by
// packed_qkv_column_sums_kernel, so the packed gradient is not read again for it.
// The backward reloads its own rows' fragments (K, V or Q, dO) from shared memory every tile: holding
// them costs 40 registers, and with them a resident block per multiprocessor.
// Every output element is written once by one lane, which sums its terms in a fixed order: the results
// are bitwise reproducible. A warp skips the tiles that lie entirely on the masked side of its rows;
// tiles crossing the diagonal apply the mask (the few all-masked 16-column blocks there are computed and
// masked rather than skipped, which keeps the inner loops free of branches). Rows at or beyond t load as
// zeros and are never stored; their lse is +inf in the backward, so they contribute P = 0.
#include <cmath>

#include "core/cuda/flash_attention_mma.cuh"
#include "core/error.h"
#include "core/philox.h"

namespace dpt::cuda_kernels {

namespace {

constexpr int kKeyTile = 64;    // keys per streamed tile (forward, dQ)
constexpr int kQueryTile = 64;  // queries per streamed tile (dK/dV)
constexpr int kWarps = 4;       // per block: 16 W = 64 rows per block tile
constexpr int kStatPad = 64;    // the statistics are padded to whole 64-row tiles (block and streamed)
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes global -> shared without staging in registers; src_size 0 fills the 16 bytes with zeros.
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
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

// Byte offset of element (row, col) in a tile with rows of kLd elements.
template <int kLd>
__device__ __forceinline__ constexpr uint32_t at(int row, int col) {
  return 2u * static_cast<uint32_t>(row * kLd + col);
}
// The lane's ldmatrix row address within a 16 x 16 block, as an A operand or a .trans B operand.
template <int kLd>
__device__ __forceinline__ uint32_t a_lane(int lane) {
  return at<kLd>(lane & 15, (lane >> 4) * 8);
}
// The lane's ldmatrix row address within a 16 x 16 block of M [n][k], as B = M^T for two 8-column blocks.
template <int kLd>
__device__ __forceinline__ uint32_t bt_lane(int lane) {
  return at<kLd>((lane & 7) + ((lane >> 4) << 3), ((lane >> 3) & 1) * 8);
}

// Rows [first, first + ROWS) of a [t, D] matrix whose rows start row_stride elements apart into the tile
// at shared address dst ([ROWS][D + 8]) with cp.async; rows at or beyond t are zero-filled (their source
// address stays the matrix start, which is never read). Every row start is 16-byte aligned (checked by
// the host, see flash_mma_operands_aligned), so the 8-element chunks are 16-byte vectors.
template <int D, int ROWS, int THREADS>
__device__ __forceinline__ void load_tile_async(const bf16_t* __restrict__ src, int64_t row_stride, int first, int t,
                                                uint32_t dst) {
  constexpr int kChunks = D / 8, kLd = D + 8, kRowStep = THREADS / kChunks;
  static_assert(THREADS % kChunks == 0 && ROWS % kRowStep == 0, "every thread copies the same chunks");
  const int r0 = static_cast<int>(threadIdx.x) / kChunks, c = static_cast<int>(threadIdx.x) % kChunks * 8;
#pragma unroll
  for (int i = 0; i < ROWS / kRowStep; ++i) {
    const int r = r0 + i * kRowStep, row = first + r;
    const bool valid = row < t;
    cp_async16(dst + at<kLd>(r, c), src + (valid ? row * row_stride + c : 0), valid);
  }
}

template <int D>
constexpr int kLdOf = D + 8;

// Column sums of the 16 W rows a block wrote: cs[n][e] is the lane's sum of its rows g and g + 8 at
// column 8 n + 2 tq + e (the values as stored, after rounding). Rows of a warp are added by shuffles over
// g, warps through shared memory `red` ([W][D] floats) in warp order, so the bits never change.
// dst[0, D) receives the block's sums. Every thread of the block must call it (two barriers).
template <int D, int W>
__device__ __forceinline__ void write_block_column_sums(float (&cs)[D / 8][2], float* red, float* __restrict__ dst) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, tq = lane & 3;
  __syncthreads();  // `red` may still be read (an earlier call) or hold the last tiles
#pragma unroll
  for (int n = 0; n < D / 8; ++n) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      float v = cs[n][e];
      v += __shfl_xor_sync(0xffffffffu, v, 4);
      v += __shfl_xor_sync(0xffffffffu, v, 8);
      v += __shfl_xor_sync(0xffffffffu, v, 16);
      if (lane < 4) red[warp * D + 8 * n + 2 * tq + e] = v;
    }
  }
  __syncthreads();
  if (threadIdx.x < D) {
    float sum = 0.0f;
#pragma unroll
    for (int w = 0; w < W; ++w) sum += red[w * D + threadIdx.x];
    dst[threadIdx.x] = sum;
  }
}

// Stores the pair (a, b) at dst rounded to bf16, unless the row is out of range, and adds the stored
// values to the lane's column sums `cs` (for write_block_column_sums).
__device__ __forceinline__ void store_pair(bf16_t* dst, bool in_range, float a, float b, float (&cs)[2]) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
  if (!in_range) return;
  *reinterpret_cast<__nv_bfloat162*>(dst) = h;
  const float2 f = __bfloat1622float2(h);
  cs[0] += f.x;
  cs[1] += f.y;
}

// Attention dropout (AttentionDropout): where a kernel's draws start, and the factor of one weight.
__device__ __forceinline__ uint64_t dropout_start(const AttentionDropout& d) {
  return d.rng.offset + (d.rng.base != nullptr ? *d.rng.base : 0);
}
__device__ __forceinline__ bool dropout_keeps(const AttentionDropout& d, uint64_t start, int64_t head, int t, int query,
                                              int key) {
  const uint64_t index =
      (static_cast<uint64_t>(head) * t + static_cast<uint64_t>(query)) * t + static_cast<uint64_t>(key);
  return philox::dropout_uniform_at(d.rng.seed, start, index) > d.p;
}
// The factors of keys `key` and `key + 1` of one query: neighbours in the draw, so mostly one Philox call.
__device__ __forceinline__ float2 dropout_pair(const AttentionDropout& d, uint64_t start, int64_t head, int t,
                                               int query, int key, float scale) {
  const uint64_t n =
      start + (static_cast<uint64_t>(head) * t + static_cast<uint64_t>(query)) * t + static_cast<uint64_t>(key);
  constexpr uint64_t kGroup = philox::kDropoutGroup;
  const philox::Words w = philox::dropout_words(d.rng.seed, n / kGroup);
  const float u0 = philox::half_of(w, n % kGroup);
  const float u1 = n % kGroup != kGroup - 1 ? philox::half_of(w, n % kGroup + 1)
                                            : philox::half_of(philox::dropout_words(d.rng.seed, n / kGroup + 1), 0);
  return make_float2(u0 > d.p ? scale : 0.0f, u1 > d.p ? scale : 0.0f);
}

template <int D, int W>
constexpr size_t forward_bytes() {
  return sizeof(bf16_t) * static_cast<size_t>(16 * W + 4 * kKeyTile) * kLdOf<D>;
}
template <int D, int W>
constexpr size_t backward_kv_bytes() {
  return sizeof(bf16_t) * static_cast<size_t>(2 * 16 * W + 4 * kQueryTile) * kLdOf<D> + sizeof(float) * 4 * kQueryTile;
}
template <int D, int W>
constexpr size_t backward_q_bytes() {
  return sizeof(bf16_t) * static_cast<size_t>(3 * 16 * W + 4 * kKeyTile) * kLdOf<D> + sizeof(float) * 2 * 16 * W;
}

// ---------------------------------------------------------------------------------------------------
// Forward. grid (bh, query tiles of 16 W), the heaviest query tiles (most keys) first.
template <int D, int W>
__global__ void __launch_bounds__(32 * W, D == 64 && W == 4 ? 4 : 1)
    flash_forward_mma_kernel(const bf16_t* __restrict__ q, const bf16_t* __restrict__ k, const bf16_t* __restrict__ v,
                             bf16_t* __restrict__ out, float* __restrict__ lse, const AttentionLayouts lay, int t,
                             float scale_log2, const AttentionDropout drop) {
  constexpr int kThreads = 32 * W, kBr = 16 * W, kBc = kKeyTile, kLd = kLdOf<D>;
  constexpr uint32_t kTileBytes = 2u * kBc * kLd;  // one K or V stage
  constexpr int kKd = D / 16, kNd = D / 8, kNs = kBc / 8, kKs = kBc / 16;
  extern __shared__ __align__(128) unsigned char mma_smem[];
  const uint32_t qs = smem_u32(mma_smem);   // [kBr][kLd]
  const uint32_t kv = qs + 2u * kBr * kLd;  // stage s: K at kv + 2 s kTileBytes, V after it
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3;
  const uint32_t a_off = a_lane<kLd>(lane), bt_off = bt_lane<kLd>(lane);
  const int q0 = (gridDim.y - 1 - blockIdx.y) * kBr;
  const int wq0 = q0 + 16 * warp;  // the warp's first query
  const int64_t qrs = lay.q.row_stride, krs = lay.k.row_stride, vrs = lay.v.row_stride, ors = lay.out.row_stride;
  const bf16_t* qh = q + lay.q.head_start(blockIdx.x);
  const bf16_t* kh = k + lay.k.head_start(blockIdx.x);
  const bf16_t* vh = v + lay.v.head_start(blockIdx.x);
  bf16_t* oh = out + lay.out.head_start(blockIdx.x);
  const int n_tiles = (min(q0 + kBr, t) - 1) / kBc + 1;

  load_tile_async<D, kBr, kThreads>(qh, qrs, q0, t, qs);
  load_tile_async<D, kBc, kThreads>(kh, krs, 0, t, kv);
  load_tile_async<D, kBc, kThreads>(vh, vrs, 0, t, kv + kTileBytes);
  cp_async_commit();

  uint32_t qf[kKd][4];
  float o[kNd][4];
#pragma unroll
  for (int n = 0; n < kNd; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
  // Rows g and g + 8 of the warp: running max (log2 units, scaled) and this lane's part of the sum.
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;
  const int r0 = wq0 + g, r1 = r0 + 8;
  const uint64_t drop_start = drop.p > 0 ? dropout_start(drop) : 0;
  const float drop_scale = 1.0f / (1.0f - drop.p);

  for (int kt = 0; kt < n_tiles; ++kt) {
    if (kt + 1 < n_tiles) {
      const uint32_t next = kv + ((kt + 1) & 1) * 2 * kTileBytes;
      load_tile_async<D, kBc, kThreads>(kh, krs, (kt + 1) * kBc, t, next);
      load_tile_async<D, kBc, kThreads>(vh, vrs, (kt + 1) * kBc, t, next + kTileBytes);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    if (kt == 0) {
#pragma unroll
      for (int kk = 0; kk < kKd; ++kk) ldsm_x4(qf[kk], qs + a_off + at<kLd>(16 * warp, 16 * kk));
    }
    const int k0 = kt * kBc;
    const uint32_t ks = kv + (kt & 1) * 2 * kTileBytes + bt_off;
    const uint32_t vs = kv + (kt & 1) * 2 * kTileBytes + kTileBytes + a_off;
    // The warp sees at least one key of this tile (warp-uniform). Then k0 <= wq0 (both multiples of
    // 16), so every row of the warp sees key k0 and its running max is finite after this tile.
    if (k0 <= wq0 + 15) {
      float s[kNs][4];
#pragma unroll
      for (int j = 0; j < kNs; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
#pragma unroll
      for (int kk = 0; kk < kKd; ++kk) {
#pragma unroll
        for (int jb = 0; jb < kKs; ++jb) {
          uint32_t b[4];
          ldsm_x4(b, ks + at<kLd>(16 * jb, 16 * kk));
          mma_bf16(s[2 * jb], qf[kk], b[0], b[1]);
          mma_bf16(s[2 * jb + 1], qf[kk], b[2], b[3]);
        }
      }
      // Mask keys after the row where the tile crosses the warp's diagonal.
      if (k0 + kBc - 1 > wq0) {
#pragma unroll
        for (int j = 0; j < kNs; ++j) {
          const int c = k0 + 8 * j + 2 * tq;
          if (c > r0) s[j][0] = -INFINITY;
          if (c + 1 > r0) s[j][1] = -INFINITY;
          if (c > r1) s[j][2] = -INFINITY;
          if (c + 1 > r1) s[j][3] = -INFINITY;
        }
      }
      // Row maxima of the raw scores (a pairwise tree, not a chain), then in scaled log2 units: the
      // scale is positive, so max(s) scale = max(s scale).
      float mx0[kNs], mx1[kNs];
#pragma unroll
      for (int j = 0; j < kNs; ++j) {
        mx0[j] = fmaxf(s[j][0], s[j][1]);
        mx1[j] = fmaxf(s[j][2], s[j][3]);
      }
#pragma unroll
      for (int w = kNs / 2; w > 0; w /= 2) {
#pragma unroll
        for (int j = 0; j < w; ++j) {
          mx0[j] = fmaxf(mx0[j], mx0[j + w]);
          mx1[j] = fmaxf(mx1[j], mx1[j + w]);
        }
      }
      const float mn0 = fmaxf(m0, quad_max(mx0[0]) * scale_log2), mn1 = fmaxf(m1, quad_max(mx1[0]) * scale_log2);
      const float alpha0 = fast_exp2(m0 - mn0), alpha1 = fast_exp2(m1 - mn1);
      m0 = mn0;
      m1 = mn1;
#pragma unroll
      for (int n = 0; n < kNd; ++n) {
        o[n][0] *= alpha0;
        o[n][1] *= alpha0;
        o[n][2] *= alpha1;
        o[n][3] *= alpha1;
      }
      uint32_t pf[kKs][4];
      float sum0[2] = {0.0f, 0.0f}, sum1[2] = {0.0f, 0.0f};
#pragma unroll
      for (int j = 0; j < kNs; ++j) {
        float p0 = fast_exp2(fmaf(s[j][0], scale_log2, -mn0)), p1 = fast_exp2(fmaf(s[j][1], scale_log2, -mn0));
        float p2 = fast_exp2(fmaf(s[j][2], scale_log2, -mn1)), p3 = fast_exp2(fmaf(s[j][3], scale_log2, -mn1));
        sum0[j & 1] += p0 + p1;
        sum1[j & 1] += p2 + p3;
        if (drop.p > 0) {  // the sums above are the softmax's; only the weights applied to V are dropped
          const int c = k0 + 8 * j + 2 * tq;
          const float2 z0 = dropout_pair(drop, drop_start, blockIdx.x, t, r0, c, drop_scale);
          const float2 z1 = dropout_pair(drop, drop_start, blockIdx.x, t, r1, c, drop_scale);
          p0 *= z0.x;
          p1 *= z0.y;
          p2 *= z1.x;
          p3 *= z1.y;
        }
        pf[j / 2][2 * (j & 1)] = pack_bf16(p0, p1);
        pf[j / 2][2 * (j & 1) + 1] = pack_bf16(p2, p3);
      }
      l0 = fmaf(l0, alpha0, sum0[0] + sum0[1]);
      l1 = fmaf(l1, alpha1, sum1[0] + sum1[1]);
#pragma unroll
      for (int kk = 0; kk < kKs; ++kk) {
#pragma unroll
        for (int dn = 0; dn < D / 16; ++dn) {
          uint32_t b[4];
          ldsm_x4_trans(b, vs + at<kLd>(16 * kk, 16 * dn));
          mma_bf16(o[2 * dn], pf[kk], b[0], b[1]);
          mma_bf16(o[2 * dn + 1], pf[kk], b[2], b[3]);
        }
      }
    }
    __syncthreads();  // everyone is done with this stage before the next iteration refills it
  }

  l0 = quad_sum(l0);
  l1 = quad_sum(l1);
  const float inv0 = 1.0f / l0, inv1 = 1.0f / l1;
#pragma unroll
  for (int n = 0; n < kNd; ++n) {
    const int c = 8 * n + 2 * tq;
    if (r0 < t)
      *reinterpret_cast<__nv_bfloat162*>(oh + r0 * ors + c) = __floats2bfloat162_rn(o[n][0] * inv0, o[n][1] * inv0);
    if (r1 < t)
      *reinterpret_cast<__nv_bfloat162*>(oh + r1 * ors + c) = __floats2bfloat162_rn(o[n][2] * inv1, o[n][3] * inv1);
  }
  if (tq == 0) {
    float* lse_h = lse + static_cast<int64_t>(blockIdx.x) * t;
    if (r0 < t) lse_h[r0] = (m0 + log2f(l0)) * kLn2;
    if (r1 < t) lse_h[r1] = (m1 + log2f(l1)) * kLn2;
  }
}

// ---------------------------------------------------------------------------------------------------
// dK, dV. grid (bh, key tiles of 16 W); key tile 0 sees every query, so it is scheduled first.
template <int D, int W>
__global__ void __launch_bounds__(32 * W, D <= 64 && W == 4 ? 3 : 1)
    flash_backward_kv_mma_kernel(const bf16_t* __restrict__ q, const bf16_t* __restrict__ k,
                                 const bf16_t* __restrict__ v, const bf16_t* __restrict__ grad_out,
                                 const float* __restrict__ lse2, const float* __restrict__ dvec,
                                 bf16_t* __restrict__ grad_k, bf16_t* __restrict__ grad_v, const AttentionLayouts lay,
                                 int t, int t_pad, float scale, float scale_log2, float* __restrict__ col_part,
                                 const AttentionDropout drop) {
  constexpr int kThreads = 32 * W, kBc = 16 * W, kBr = kQueryTile, kLd = kLdOf<D>;
  constexpr uint32_t kTileBytes = 2u * kBr * kLd;  // one Q or dO stage
  constexpr int kKd = D / 16, kNd = D / 8, kNs = kBr / 8, kKs = kBr / 16;
  extern __shared__ __align__(128) unsigned char mma_smem[];
  const uint32_t ks = smem_u32(mma_smem);   // [kBc][kLd]
  const uint32_t vs = ks + 2u * kBc * kLd;  // [kBc][kLd]
  const uint32_t qd = vs + 2u * kBc * kLd;  // stage s: Q at qd + 2 s kTileBytes, dO after it
  // stage s: lse2 [64] at stats + 2 s kBr, dvec after it
  float* stats = reinterpret_cast<float*>(mma_smem + 2 * 2 * kBc * kLd + 4 * kTileBytes);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3;
  const uint32_t a_off = a_lane<kLd>(lane), bt_off = bt_lane<kLd>(lane);
  const int k0 = blockIdx.y * kBc;
  const int wk0 = k0 + 16 * warp;  // the warp's first key
  const int64_t sbase = static_cast<int64_t>(blockIdx.x) * t_pad;
  // grad_k has k's layout, grad_v v's, grad_out out's.
  const int64_t qrs = lay.q.row_stride, krs = lay.k.row_stride, vrs = lay.v.row_stride, ors = lay.out.row_stride;
  const int64_t kbase = lay.k.head_start(blockIdx.x), vbase = lay.v.head_start(blockIdx.x);
  const bf16_t* qh = q + lay.q.head_start(blockIdx.x);
  const bf16_t* doh = grad_out + lay.out.head_start(blockIdx.x);
  const int qt0 = k0 / kBr, n_qt = (t + kBr - 1) / kBr;

  auto load_stage = [&](int qt, int stage) {
    const uint32_t dst = qd + stage * 2 * kTileBytes;
    load_tile_async<D, kBr, kThreads>(qh, qrs, qt * kBr, t, dst);
    load_tile_async<D, kBr, kThreads>(doh, ors, qt * kBr, t, dst + kTileBytes);
    // 2 x 64 floats = 32 chunks of 16 bytes; the padded statistics need no bounds check.
    if (threadIdx.x < 2 * kBr / 4) {
      const int which = threadIdx.x / (kBr / 4), c = (threadIdx.x % (kBr / 4)) * 4;
      const float* src = (which == 0 ? lse2 : dvec) + sbase + qt * kBr + c;
      cp_async16(smem_u32(stats + (2 * stage + which) * kBr + c), src, true);
    }
  };
  load_tile_async<D, kBc, kThreads>(k + kbase, krs, k0, t, ks);
  load_tile_async<D, kBc, kThreads>(v + vbase, vrs, k0, t, vs);
  load_stage(qt0, 0);
  cp_async_commit();

  float dka[kNd][4], dva[kNd][4];
#pragma unroll
  for (int n = 0; n < kNd; ++n) {
#pragma unroll
    for (int e = 0; e < 4; ++e) dka[n][e] = dva[n][e] = 0.0f;
  }
  const int kr0 = wk0 + g, kr1 = kr0 + 8;  // this lane's keys
  const uint64_t drop_start = drop.p > 0 ? dropout_start(drop) : 0;
  const float drop_scale = 1.0f / (1.0f - drop.p);
  static_assert(kNs * 4 <= 32, "one bit per weight of a lane");
  const uint32_t ka = ks + a_off + at<kLd>(16 * warp, 0), va = vs + a_off + at<kLd>(16 * warp, 0);

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
    const int q0 = qt * kBr;
    const uint32_t qs = qd + stage * 2 * kTileBytes, dos = qs + kTileBytes;
    const float* lse_s = stats + 2 * stage * kBr;
    const float* dvec_s = lse_s + kBr;
    if (q0 + kBr - 1 >= wk0) {  // some query of the tile sees a key of the warp (warp-uniform)
      // S^T = K Q^T (keys x queries), then P^T in place.
      float p[kNs][4];
#pragma unroll
      for (int j = 0; j < kNs; ++j) p[j][0] = p[j][1] = p[j][2] = p[j][3] = 0.0f;
#pragma unroll
      for (int kk = 0; kk < kKd; ++kk) {
        uint32_t a[4];
        ldsm_x4(a, ka + at<kLd>(0, 16 * kk));
#pragma unroll
        for (int jb = 0; jb < kKs; ++jb) {
          uint32_t b[4];
          ldsm_x4(b, qs + bt_off + at<kLd>(16 * jb, 16 * kk));
          mma_bf16(p[2 * jb], a, b[0], b[1]);
          mma_bf16(p[2 * jb + 1], a, b[2], b[3]);
        }
      }
      const bool diag = q0 < wk0 + 15;  // some query of the tile precedes some key of the warp
      uint32_t pf[kKs][4];
      uint32_t kept = 0xffffffffu;  // bit 4 j + e: weight p[j][e] survives dropout
#pragma unroll
      for (int j = 0; j < kNs; ++j) {
        const int c = 8 * j + 2 * tq;  // the lane's queries q0 + c, q0 + c + 1
        const float2 lq = *reinterpret_cast<const float2*>(lse_s + c);
        p[j][0] = fast_exp2(fmaf(p[j][0], scale_log2, -lq.x));
        p[j][1] = fast_exp2(fmaf(p[j][1], scale_log2, -lq.y));
        p[j][2] = fast_exp2(fmaf(p[j][2], scale_log2, -lq.x));
        p[j][3] = fast_exp2(fmaf(p[j][3], scale_log2, -lq.y));
        if (diag) {  // query before key: invisible
          const int qc = q0 + c;
          if (qc < kr0) p[j][0] = 0.0f;
          if (qc + 1 < kr0) p[j][1] = 0.0f;
          if (qc < kr1) p[j][2] = 0.0f;
          if (qc + 1 < kr1) p[j][3] = 0.0f;
        }
        float z0 = 1.0f, z1 = 1.0f, z2 = 1.0f, z3 = 1.0f;
        if (drop.p > 0) {
          const int qc = q0 + c;
          const bool k0b = dropout_keeps(drop, drop_start, blockIdx.x, t, qc, kr0);
          const bool k1b = dropout_keeps(drop, drop_start, blockIdx.x, t, qc + 1, kr0);
          const bool k2b = dropout_keeps(drop, drop_start, blockIdx.x, t, qc, kr1);
          const bool k3b = dropout_keeps(drop, drop_start, blockIdx.x, t, qc + 1, kr1);
          kept &= ~((uint32_t{!k0b} | uint32_t{!k1b} << 1 | uint32_t{!k2b} << 2 | uint32_t{!k3b} << 3) << (4 * j));
          z0 = k0b ? drop_scale : 0.0f;
          z1 = k1b ? drop_scale : 0.0f;
          z2 = k2b ? drop_scale : 0.0f;
          z3 = k3b ? drop_scale : 0.0f;
        }
        // dV takes the weights as applied to V: after dropout.
        pf[j / 2][2 * (j & 1)] = pack_bf16(p[j][0] * z0, p[j][1] * z1);
        pf[j / 2][2 * (j & 1) + 1] = pack_bf16(p[j][2] * z2, p[j][3] * z3);
      }
      // dV += P^T dO.
#pragma unroll
      for (int kk = 0; kk < kKs; ++kk) {
#pragma unroll
        for (int dn = 0; dn < D / 16; ++dn) {
          uint32_t b[4];
          ldsm_x4_trans(b, dos + a_off + at<kLd>(16 * kk, 16 * dn));
          mma_bf16(dva[2 * dn], pf[kk], b[0], b[1]);
          mma_bf16(dva[2 * dn + 1], pf[kk], b[2], b[3]);
        }
      }
      // dP^T = V dO^T.
      float dp[kNs][4];
#pragma unroll
      for (int j = 0; j < kNs; ++j) dp[j][0] = dp[j][1] = dp[j][2] = dp[j][3] = 0.0f;
#pragma unroll
      for (int kk = 0; kk < kKd; ++kk) {
        uint32_t a[4];
        ldsm_x4(a, va + at<kLd>(0, 16 * kk));
#pragma unroll
        for (int jb = 0; jb < kKs; ++jb) {
          uint32_t b[4];
          ldsm_x4(b, dos + bt_off + at<kLd>(16 * jb, 16 * kk));
          mma_bf16(dp[2 * jb], a, b[0], b[1]);
          mma_bf16(dp[2 * jb + 1], a, b[2], b[3]);
        }
      }
      // dS^T = P^T (dP^T Z - dvec), Z the dropout factors (1 without dropout), rounded to bf16 as the A
      // operand of dK += dS^T Q.
      if (drop.p > 0) {
#pragma unroll
        for (int j = 0; j < kNs; ++j) {
#pragma unroll
          for (int e = 0; e < 4; ++e) dp[j][e] *= (kept >> (4 * j + e)) & 1u ? drop_scale : 0.0f;
        }
      }
#pragma unroll
      for (int j = 0; j < kNs; ++j) {
        const float2 dv2 = *reinterpret_cast<const float2*>(dvec_s + 8 * j + 2 * tq);
        pf[j / 2][2 * (j & 1)] = pack_bf16(p[j][0] * (dp[j][0] - dv2.x), p[j][1] * (dp[j][1] - dv2.y));
        pf[j / 2][2 * (j & 1) + 1] = pack_bf16(p[j][2] * (dp[j][2] - dv2.x), p[j][3] * (dp[j][3] - dv2.y));
      }
#pragma unroll
      for (int kk = 0; kk < kKs; ++kk) {
#pragma unroll
        for (int dn = 0; dn < D / 16; ++dn) {
          uint32_t b[4];
          ldsm_x4_trans(b, qs + a_off + at<kLd>(16 * kk, 16 * dn));
          mma_bf16(dka[2 * dn], pf[kk], b[0], b[1]);
          mma_bf16(dka[2 * dn + 1], pf[kk], b[2], b[3]);
        }
      }
    }
    __syncthreads();  // everyone is done with this stage before the next iteration refills it
  }

  float ksum[kNd][2] = {}, vsum[kNd][2] = {};
#pragma unroll
  for (int n = 0; n < kNd; ++n) {
    const int c = 8 * n + 2 * tq;
    store_pair(grad_v + vbase + kr0 * vrs + c, kr0 < t, dva[n][0], dva[n][1], vsum[n]);
    store_pair(grad_k + kbase + kr0 * krs + c, kr0 < t, dka[n][0] * scale, dka[n][1] * scale, ksum[n]);
    store_pair(grad_v + vbase + kr1 * vrs + c, kr1 < t, dva[n][2], dva[n][3], vsum[n]);
    store_pair(grad_k + kbase + kr1 * krs + c, kr1 < t, dka[n][2] * scale, dka[n][3] * scale, ksum[n]);
  }
  if (col_part != nullptr) {  // [3][bh][tiles][D]: this block's sums of dK (part 1) and dV (part 2)
    const int64_t part = static_cast<int64_t>(gridDim.x) * gridDim.y * D;
    float* dst = col_part + (static_cast<int64_t>(blockIdx.x) * gridDim.y + blockIdx.y) * D;
    float* red = reinterpret_cast<float*>(mma_smem);
    write_block_column_sums<D, W>(ksum, red, dst + part);
    write_block_column_sums<D, W>(vsum, red, dst + 2 * part);
  }
}

// ---------------------------------------------------------------------------------------------------
// dQ, and the statistics the dK/dV kernel reads. grid (bh, query tiles of 16 W), the heaviest query tiles first.
template <int D, int W>
__global__ void __launch_bounds__(32 * W, D <= 64 && W == 4 ? 3 : 1)
    flash_backward_q_mma_kernel(const bf16_t* __restrict__ q, const bf16_t* __restrict__ k,
                                const bf16_t* __restrict__ v, const bf16_t* __restrict__ out,
                                const bf16_t* __restrict__ grad_out, const float* __restrict__ lse,
                                float* __restrict__ lse2, float* __restrict__ dvec, bf16_t* __restrict__ grad_q,
                                const AttentionLayouts lay, int t, int t_pad, float scale, float scale_log2,
                                float* __restrict__ col_part, const AttentionDropout drop) {
  constexpr int kThreads = 32 * W, kBr = 16 * W, kBc = kKeyTile, kLd = kLdOf<D>;
  constexpr uint32_t kTileBytes = 2u * kBc * kLd;  // one K or V stage
  constexpr int kKd = D / 16, kNd = D / 8, kNs = kBc / 8, kKs = kBc / 16;
  extern __shared__ __align__(128) unsigned char mma_smem[];
  const uint32_t qs = smem_u32(mma_smem);    // [kBr][kLd]
  const uint32_t dos = qs + 2u * kBr * kLd;  // [kBr][kLd]
  const uint32_t kv = dos + 2u * kBr * kLd;  // stage s: K at kv + 2 s kTileBytes, V after it
  const uint32_t os = kv + 4 * kTileBytes;   // [kBr][kLd], O for the statistics
  auto generic = [&](uint32_t addr) { return mma_smem + (addr - qs); };          // a shared address as a pointer
  float* const stat_s = reinterpret_cast<float*>(generic(os + 2u * kBr * kLd));  // lse2 [kBr], dvec [kBr]
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3;
  const uint32_t a_off = a_lane<kLd>(lane), bt_off = bt_lane<kLd>(lane);
  const int q0 = (gridDim.y - 1 - blockIdx.y) * kBr;
  const int wq0 = q0 + 16 * warp;
  // grad_q has q's layout, grad_out out's.
  const int64_t qrs = lay.q.row_stride, krs = lay.k.row_stride, vrs = lay.v.row_stride, ors = lay.out.row_stride;
  const int64_t qbase = lay.q.head_start(blockIdx.x);
  const bf16_t* kh = k + lay.k.head_start(blockIdx.x);
  const bf16_t* vh = v + lay.v.head_start(blockIdx.x);
  const int n_tiles = (min(q0 + kBr, t) - 1) / kBc + 1;
  const int r0 = wq0 + g, r1 = r0 + 8;
  // t_pad is a multiple of 64 = kBr: every row of the block has a slot in lse2 and dvec.
  const int64_t sbase = static_cast<int64_t>(blockIdx.x) * t_pad;
  load_tile_async<D, kBr, kThreads>(q + qbase, qrs, q0, t, qs);
  load_tile_async<D, kBr, kThreads>(grad_out + lay.out.head_start(blockIdx.x), ors, q0, t, dos);
  load_tile_async<D, kBr, kThreads>(out + lay.out.head_start(blockIdx.x), ors, q0, t, os);
  cp_async_commit();
  load_tile_async<D, kBc, kThreads>(kh, krs, 0, t, kv);
  load_tile_async<D, kBc, kThreads>(vh, vrs, 0, t, kv + kTileBytes);
  cp_async_commit();
  cp_async_wait<1>();  // this block's rows; the first K and V tiles load meanwhile
  __syncthreads();
  // The block's rows' statistics, for itself and (through lse2 and dvec) for the dK/dV kernel that runs
  // next: two threads per row (32 W threads, 16 W rows), each summing half of dO . O from the tiles.
  {
    const int row = threadIdx.x >> 1, half = threadIdx.x & 1;
    const auto* o2 = reinterpret_cast<const __nv_bfloat162*>(generic(os + at<kLd>(row, half * D / 2)));
    const auto* g2 = reinterpret_cast<const __nv_bfloat162*>(generic(dos + at<kLd>(row, half * D / 2)));
    float dot = 0.0f;
#pragma unroll
    for (int i = 0; i < D / 4; ++i) {
      const float2 o = __bfloat1622float2(o2[i]), g = __bfloat1622float2(g2[i]);
      dot = fmaf(g.x, o.x, dot);
      dot = fmaf(g.y, o.y, dot);
    }
    dot += __shfl_xor_sync(0xffffffffu, dot, 1);
    if (half == 0) {
      const int r = q0 + row;  // rows past t: dO and O load as zeros, so dot = 0; lse2 = +inf gives P = 0
      const float l2 = r < t ? lse[static_cast<int64_t>(blockIdx.x) * t + r] * kLog2e : INFINITY;
      stat_s[row] = l2;
      stat_s[kBr + row] = dot;
      lse2[sbase + r] = l2;
      dvec[sbase + r] = dot;
    }
  }
  __syncthreads();
  const float lse0 = stat_s[16 * warp + g], lse1 = stat_s[16 * warp + g + 8];
  const float dvec0 = stat_s[kBr + 16 * warp + g], dvec1 = stat_s[kBr + 16 * warp + g + 8];
  const uint64_t drop_start = drop.p > 0 ? dropout_start(drop) : 0;
  const float drop_scale = 1.0f / (1.0f - drop.p);

  float dqa[kNd][4];
#pragma unroll
  for (int n = 0; n < kNd; ++n) dqa[n][0] = dqa[n][1] = dqa[n][2] = dqa[n][3] = 0.0f;
  const uint32_t qa = qs + a_off + at<kLd>(16 * warp, 0), oa = dos + a_off + at<kLd>(16 * warp, 0);

  for (int kt = 0; kt < n_tiles; ++kt) {
    if (kt + 1 < n_tiles) {
      const uint32_t next = kv + ((kt + 1) & 1) * 2 * kTileBytes;
      load_tile_async<D, kBc, kThreads>(kh, krs, (kt + 1) * kBc, t, next);
      load_tile_async<D, kBc, kThreads>(vh, vrs, (kt + 1) * kBc, t, next + kTileBytes);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const int k0 = kt * kBc;
    const uint32_t ks = kv + (kt & 1) * 2 * kTileBytes, vs = ks + kTileBytes;
    if (k0 <= wq0 + 15) {
      float p[kNs][4], dp[kNs][4];
#pragma unroll
      for (int j = 0; j < kNs; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) p[j][e] = dp[j][e] = 0.0f;
      }
#pragma unroll
      for (int kk = 0; kk < kKd; ++kk) {
        uint32_t a[4], ao[4];
        ldsm_x4(a, qa + at<kLd>(0, 16 * kk));
        ldsm_x4(ao, oa + at<kLd>(0, 16 * kk));
#pragma unroll
        for (int jb = 0; jb < kKs; ++jb) {
          uint32_t b[4];
          ldsm_x4(b, ks + bt_off + at<kLd>(16 * jb, 16 * kk));
          mma_bf16(p[2 * jb], a, b[0], b[1]);
          mma_bf16(p[2 * jb + 1], a, b[2], b[3]);
          ldsm_x4(b, vs + bt_off + at<kLd>(16 * jb, 16 * kk));
          mma_bf16(dp[2 * jb], ao, b[0], b[1]);
          mma_bf16(dp[2 * jb + 1], ao, b[2], b[3]);
        }
      }
      const bool diag = k0 + kBc - 1 > wq0;
      uint32_t dsf[kKs][4];
#pragma unroll
      for (int j = 0; j < kNs; ++j) {
        const int c = k0 + 8 * j + 2 * tq;
        p[j][0] = fast_exp2(fmaf(p[j][0], scale_log2, -lse0));
        p[j][1] = fast_exp2(fmaf(p[j][1], scale_log2, -lse0));
        p[j][2] = fast_exp2(fmaf(p[j][2], scale_log2, -lse1));
        p[j][3] = fast_exp2(fmaf(p[j][3], scale_log2, -lse1));
        if (diag) {  // key after the row: invisible
          if (c > r0) p[j][0] = 0.0f;
          if (c + 1 > r0) p[j][1] = 0.0f;
          if (c > r1) p[j][2] = 0.0f;
          if (c + 1 > r1) p[j][3] = 0.0f;
        }
        if (drop.p > 0) {  // dS = P (dP Z - dvec)
          const float2 z0 = dropout_pair(drop, drop_start, blockIdx.x, t, r0, c, drop_scale);
          const float2 z1 = dropout_pair(drop, drop_start, blockIdx.x, t, r1, c, drop_scale);
          dp[j][0] *= z0.x;
          dp[j][1] *= z0.y;
          dp[j][2] *= z1.x;
          dp[j][3] *= z1.y;
        }
        dsf[j / 2][2 * (j & 1)] = pack_bf16(p[j][0] * (dp[j][0] - dvec0), p[j][1] * (dp[j][1] - dvec0));
        dsf[j / 2][2 * (j & 1) + 1] = pack_bf16(p[j][2] * (dp[j][2] - dvec1), p[j][3] * (dp[j][3] - dvec1));
      }
      // dQ += dS K.
#pragma unroll
      for (int kk = 0; kk < kKs; ++kk) {
#pragma unroll
        for (int dn = 0; dn < D / 16; ++dn) {
          uint32_t b[4];
          ldsm_x4_trans(b, ks + a_off + at<kLd>(16 * kk, 16 * dn));
          mma_bf16(dqa[2 * dn], dsf[kk], b[0], b[1]);
          mma_bf16(dqa[2 * dn + 1], dsf[kk], b[2], b[3]);
        }
      }
    }
    __syncthreads();
  }

  float qsum[kNd][2] = {};
#pragma unroll
  for (int n = 0; n < kNd; ++n) {
    const int c = 8 * n + 2 * tq;
    store_pair(grad_q + qbase + r0 * qrs + c, r0 < t, dqa[n][0] * scale, dqa[n][1] * scale, qsum[n]);
    store_pair(grad_q + qbase + r1 * qrs + c, r1 < t, dqa[n][2] * scale, dqa[n][3] * scale, qsum[n]);
  }
  if (col_part != nullptr) {  // [3][bh][tiles][D]: this block's sums of dQ (part 0)
    const int tile = static_cast<int>(gridDim.y) - 1 - static_cast<int>(blockIdx.y);
    write_block_column_sums<D, W>(qsum, reinterpret_cast<float*>(mma_smem),
                                  col_part + (static_cast<int64_t>(blockIdx.x) * gridDim.y + tile) * D);
  }
}

// sums[j] for the packed [B, T, 3 C] gradient (C = heads D; column j is part j / C, head (j % C) / D, column
// j % D of that head): the sum over batches b and row tiles of the blocks' partial sums, read from
// part [3][B heads][tiles][D]. Block (32, kSumLanes) owns 32 columns of one head (32 divides D): lane ty
// adds the (b, tile) pairs ty, ty + kSumLanes, ... in order, then lane 0 adds the lanes in order.
constexpr int kSumLanes = 16;

template <class Out>
__global__ void __launch_bounds__(32 * kSumLanes)
    packed_qkv_column_sums_kernel(const float* __restrict__ part, int batch, int heads, int tiles, int d,
                                  Out* __restrict__ sums) {
  __shared__ float lanes[kSumLanes][33];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int c = heads * d, j = blockIdx.x * 32 + tx;
  const int which = j / c, h = (j % c) / d, col = j % d;
  const int pairs = batch * tiles;
  float sum = 0.0f;
#pragma unroll 4
  for (int i = ty; i < pairs; i += kSumLanes) {
    const int b = i / tiles, tile = i % tiles;
    sum += part[((static_cast<int64_t>(which) * batch * heads + b * heads + h) * tiles + tile) * d + col];
  }
  lanes[ty][tx] = sum;
  __syncthreads();
  if (ty == 0) {
    for (int l = 1; l < kSumLanes; ++l) sum += lanes[l][tx];
    sums[j] = convert<Out>(sum);
  }
}

// ---------------------------------------------------------------------------------------------------

template <class Out>
void launch_column_sums(const float* part, int64_t batch, int64_t heads, int tiles, int d, void* sums,
                        cudaStream_t stream) {
  DPT_CHECK(d % 32 == 0 && 3 * batch * heads * tiles * d <= 0x7fffffff,
            "flash_attention_backward (CUDA): column sums of {} x {} heads of size {} exceed the kernel's range", batch,
            heads, d);
  packed_qkv_column_sums_kernel<Out><<<static_cast<unsigned>(3 * heads * d / 32), dim3(32, kSumLanes), 0, stream>>>(
      part, static_cast<int>(batch), static_cast<int>(heads), tiles, d, static_cast<Out*>(sums));
  DPT_CUDA_CHECK_LAUNCH();
}

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

// Calls f(std::integral_constant<int, D>, std::integral_constant<int, kWarps>).
template <class F>
void visit_mma(int64_t d, const char* what, F&& f) {
  using std::integral_constant;
  using Warps = integral_constant<int, kWarps>;
  switch (d) {
    case 32:
      return f(integral_constant<int, 32>{}, Warps{});
    case 64:
      return f(integral_constant<int, 64>{}, Warps{});
    case 128:
      return f(integral_constant<int, 128>{}, Warps{});
    default:
      DPT_FAIL("{} (CUDA): expected head size 32, 64 or 128, found {}", what, d);
  }
}

}  // namespace

bool flash_mma_supports(int64_t d, double scale) { return (d == 32 || d == 64 || d == 128) && scale > 0; }

bool flash_mma_operands_aligned(std::initializer_list<std::pair<const void*, AttentionLayout>> operands) {
  for (const auto& [buffer, layout] : operands) {
    if (!aligned16(buffer) || !layout.rows_aligned_to(16 / static_cast<int64_t>(sizeof(bf16_t)))) return false;
  }
  return true;
}

void flash_forward_mma(const bf16_t* q, const bf16_t* k, const bf16_t* v, bf16_t* out, float* lse,
                       const AttentionLayouts& layouts, int64_t bh, int64_t t, int64_t d, float scale_log2,
                       cudaStream_t stream, const AttentionDropout& dropout) {
  visit_mma(d, "flash_attention_forward", [&](auto dim, auto warps) {
    constexpr int D = decltype(dim)::value, W = decltype(warps)::value;
    launch(flash_forward_mma_kernel<D, W>, mma_grid(bh, t, 16 * W, "flash_attention_forward"), 32 * W,
           forward_bytes<D, W>(), stream, q, k, v, out, lse, layouts, static_cast<int>(t), scale_log2, dropout);
  });
}

void flash_backward_mma(const bf16_t* q, const bf16_t* k, const bf16_t* v, const bf16_t* out, const bf16_t* grad_out,
                        const float* lse, bf16_t* grad_q, bf16_t* grad_k, bf16_t* grad_v,
                        const AttentionLayouts& layouts, int64_t bh, int64_t t, int64_t d, float scale, int device,
                        cudaStream_t stream, const PackedColumnSums& column_sums, const AttentionDropout& dropout) {
  const int64_t t_pad = (t + kStatPad - 1) / kStatPad * kStatPad;
  const int64_t rows_pad = bh * t_pad;
  DeviceBuffer stats(2 * static_cast<size_t>(rows_pad) * sizeof(float), device);
  float* lse2 = stats.as<float>();
  float* dvec = lse2 + rows_pad;
  const float scale_log2 = scale * kLog2e;
  visit_mma(d, "flash_attention_backward", [&](auto dim, auto warps) {
    constexpr int D = decltype(dim)::value, W = decltype(warps)::value;
    const dim3 grid = mma_grid(bh, t, 16 * W, "flash_attention_backward");
    // The blocks' column sums of dQ, dK and dV: [3][bh][tiles][D] floats, summed at the end.
    const bool sums = column_sums.sums != nullptr;
    DeviceBuffer partials(sums ? 3 * static_cast<size_t>(bh) * grid.y * D * sizeof(float) : 0, device);
    float* col_part = sums ? partials.as<float>() : nullptr;
    // dQ first: it writes the statistics (lse2, dvec) that the dK/dV kernel reads.
    launch(flash_backward_q_mma_kernel<D, W>, grid, 32 * W, backward_q_bytes<D, W>(), stream, q, k, v, out, grad_out,
           lse, lse2, dvec, grad_q, layouts, static_cast<int>(t), static_cast<int>(t_pad), scale, scale_log2, col_part,
           dropout);
    launch(flash_backward_kv_mma_kernel<D, W>, grid, 32 * W, backward_kv_bytes<D, W>(), stream, q, k, v, grad_out,
           static_cast<const float*>(lse2), static_cast<const float*>(dvec), grad_k, grad_v, layouts,
           static_cast<int>(t), static_cast<int>(t_pad), scale, scale_log2, col_part, dropout);
    if (!sums) return;
    auto* sum_launch = column_sums.bf16 ? launch_column_sums<bf16_t> : launch_column_sums<float>;
    sum_launch(col_part, bh / column_sums.heads, column_sums.heads, static_cast<int>(grid.y), D, column_sums.sums,
               stream);
  });
}

}  // namespace dpt::cuda_kernels
