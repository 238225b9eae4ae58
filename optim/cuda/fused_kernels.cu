// Fused multi-tensor optimizer kernels (see fused_kernels.h for the launch scheme).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/cuda/check.h"
#include "core/cuda/stream.h"
#include "core/error.h"
#include "optim/cuda/fused_kernels.h"

namespace dpt::optim::cuda {

namespace {

// Each block handles one chunk of one tensor. A launch carries up to kMaxTensors tensors (pointers,
// sizes and the running count of chunks before each) in its argument struct, and one block per chunk
// of all of them: a block finds its tensor by binary search over that count. Every chunk of a pack
// goes into one launch, so a model of a few dozen tensors is one launch whatever their sizes.
//
// Why chunks of 16384 elements: a launch of B blocks runs in ceil(B / R) waves, R the blocks resident at
// once, and the last wave is partly idle. The vectorised Adam kernels use 40-45 registers per thread, so
// an SM holds 2 blocks of 512 threads (R = 264 on a 132-SM H100/H200; the scalar twin kernel, at 28
// registers, fit 4). The 92M-parameter MLP makes ~5630 chunks of 16384: ~21 waves, the partial last one
// a few percent of the time, where packs of at most 640 blocks of 65536 elements gave 3 launches of
// ~1.2 waves each, their second wave mostly idle. Two blocks of 512 threads, each thread loading 56 bytes per 4-element
// step with twins, keep ~57 KB in flight per SM, above the ~25 KB per SM that HBM bandwidth
// times latency (~4.8 TB/s x ~0.7 us over 132 SMs) asks for.
constexpr int kMaxLists = 5;
constexpr int kMaxTensors = 110;
constexpr int64_t kChunk = 16384;  // elements per block; a multiple of 4 * kThreads
constexpr int kThreads = 512;
static_assert(kChunk % (4 * kThreads) == 0, "a chunk is whole float4 steps of every thread");

// kLists pointer lists of up to kPackTensors tensors each: the kernels' argument.
template <int kLists, int kPackTensors = kMaxTensors>
struct TensorPack {
  static constexpr int kCapacity = kPackTensors;
  void* ptrs[kLists][kPackTensors];
  int64_t sizes[kPackTensors];
  int32_t first_chunk[kPackTensors + 1];  // tensor t's chunks are blocks [first_chunk[t], first_chunk[t + 1])
  uint8_t vector_ok[kPackTensors];        // every pointer of tensor t is aligned for 4-element accesses
  int32_t num_tensors;
};
using MultiTensorArgs = TensorPack<kMaxLists>;
static_assert(sizeof(MultiTensorArgs) < 32 * 1024, "kernel parameters are limited to 32 KB (CUDA 12.1+)");

// The tensor whose chunks include block `block`: the last t with first_chunk[t] <= block.
template <class Pack>
__device__ __forceinline__ int tensor_of_block(const Pack& args, int block) {
  int lo = 0, hi = args.num_tensors - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (args.first_chunk[mid] <= block) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo;
}

// This block's tensor and element range [begin, end).
struct ChunkRange {
  int tensor;
  int64_t begin, end;
};
template <class Pack>
__device__ __forceinline__ ChunkRange chunk_of_block(const Pack& args, int block = static_cast<int>(blockIdx.x)) {
  const int t = tensor_of_block(args, block);
  const int64_t begin = static_cast<int64_t>(block - args.first_chunk[t]) * kChunk;
  return {t, begin, min(begin + kChunk, args.sizes[t])};
}

// Calls launch(args, num_blocks, first_block) for successive packs of up to kMaxTensors tensors.
// `elem_bytes[l]` is the element size of list l: a tensor takes the vector path when each of its
// pointers is a multiple of 4 elements' bytes (a null pointer, an absent list, counts as aligned).
// `first_block` numbers blocks globally across launches (used to place per-block partial sums).
template <class Pack = MultiTensorArgs, class Launch>
void multi_tensor_apply(int num_lists, const std::vector<std::vector<void*>>& lists, const std::vector<int64_t>& sizes,
                        const std::vector<int>& elem_bytes, Launch launch) {
  Pack args;
  int tensors = 0, chunks = 0, first_block = 0;
  auto flush = [&] {
    if (chunks > 0) {
      args.first_chunk[tensors] = chunks;
      args.num_tensors = tensors;
      launch(args, chunks, first_block);
    }
    first_block += chunks;
    tensors = 0;
    chunks = 0;
  };
  for (size_t t = 0; t < sizes.size(); ++t) {
    if (sizes[t] == 0) continue;
    bool aligned = true;
    for (int l = 0; l < num_lists; ++l) {
      void* ptr = lists[static_cast<size_t>(l)][t];
      args.ptrs[l][tensors] = ptr;
      const auto alignment = static_cast<uintptr_t>(4 * elem_bytes[static_cast<size_t>(l)]);
      aligned = aligned && reinterpret_cast<uintptr_t>(ptr) % alignment == 0;
    }
    args.sizes[tensors] = sizes[t];
    args.vector_ok[tensors] = aligned ? 1 : 0;
    args.first_chunk[tensors] = chunks;
    chunks += static_cast<int>((sizes[t] + kChunk - 1) / kChunk);
    ++tensors;
    if (tensors == Pack::kCapacity) flush();
  }
  flush();
}

int64_t count_blocks(const std::vector<int64_t>& sizes) {
  int64_t n = 0;
  for (int64_t s : sizes) n += (s + kChunk - 1) / kChunk;
  return n;
}

// One Adam(W) element update in float32. Both the vector and the scalar paths call this, so every
// element gets the same operations in the same order whichever path it takes. kDecoupled is a template
// parameter, not a runtime branch: a branch inside the 4-element body is if-converted into selects
// between w and w * (1 - lr * wd), which would keep the code generator from contracting that product
// with the final subtraction the way it may in the scalar loop, and the two paths could then round
// differently.
template <bool kDecoupled>
__device__ __forceinline__ float adam_element(float w, float grad, float& m, float& v, const AdamParams& hp) {
  grad = __fmul_rn(grad, hp.grad_scale);  // rounded on its own, as a scaled gradient in memory; exact for 1
  if constexpr (kDecoupled) {
    w *= 1.f - hp.lr * hp.weight_decay;
  } else {
    grad += hp.weight_decay * w;
  }
  const float mi = hp.beta1 * m + (1.f - hp.beta1) * grad;
  const float vi = hp.beta2 * v + (1.f - hp.beta2) * grad * grad;
  m = mi;
  v = vi;
  return w - hp.lr * (mi / hp.bias_correction1) / (sqrtf(vi / hp.bias_correction2) + hp.eps);
}

// Four consecutive gradients as float: one 16-byte load of float32, one 8-byte load of bf16.
__device__ __forceinline__ float4 load_grad4(const float* g) { return *reinterpret_cast<const float4*>(g); }
__device__ __forceinline__ float4 load_grad4(const __nv_bfloat16* g) {
  const uint2 raw = *reinterpret_cast<const uint2*>(g);
  const float2 lo = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw.x));
  const float2 hi = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw.y));
  return make_float4(lo.x, lo.y, hi.x, hi.y);
}

// Visits this block's elements: quad(i) for each group of 4 starting at i when every pointer of the
// tensor is aligned for 4-element accesses, then one(i) for the rest (all of them when it is not).
// Alignment invariant: chunks start at multiples of kChunk (a multiple of 4) from the tensor's start,
// so base + begin + 4q keeps the base pointer's 4-element alignment that the host checked.
template <class Pack, class Quad, class One>
__device__ __forceinline__ void for_each_element(const Pack& args, const ChunkRange& c, Quad quad, One one) {
  int64_t scalar_from = c.begin;
  if (args.vector_ok[c.tensor]) {
    const int64_t quads = (c.end - c.begin) / 4;
    for (int64_t q = threadIdx.x; q < quads; q += blockDim.x) quad(c.begin + 4 * q);
    scalar_from = c.begin + 4 * quads;
  }
  for (int64_t i = scalar_from + threadIdx.x; i < c.end; i += blockDim.x) one(i);
}

__device__ __forceinline__ float4 load4(const float* x) { return *reinterpret_cast<const float4*>(x); }
__device__ __forceinline__ void store4(float* x, const float4& value) { *reinterpret_cast<float4*>(x) = value; }

// Four elements' update from p, m, v into p_out, m_out, v_out (the same pointers for an update in place),
// and with kTwin the new values rounded into twin.
template <bool kDecoupled, bool kTwin>
__device__ __forceinline__ void adam_quad(const float* p, const float* m, const float* v, const float4& gi,
                                          float* p_out, float* m_out, float* v_out, __nv_bfloat16* twin,
                                          const AdamParams& hp) {
  float4 w = load4(p), mi = load4(m), vi = load4(v);
  w.x = adam_element<kDecoupled>(w.x, gi.x, mi.x, vi.x, hp);
  w.y = adam_element<kDecoupled>(w.y, gi.y, mi.y, vi.y, hp);
  w.z = adam_element<kDecoupled>(w.z, gi.z, mi.z, vi.z, hp);
  w.w = adam_element<kDecoupled>(w.w, gi.w, mi.w, vi.w, hp);
  store4(p_out, w);
  store4(m_out, mi);
  store4(v_out, vi);
  if constexpr (kTwin) {
    uint2 packed;
    *reinterpret_cast<__nv_bfloat162*>(&packed.x) = __floats2bfloat162_rn(w.x, w.y);
    *reinterpret_cast<__nv_bfloat162*>(&packed.y) = __floats2bfloat162_rn(w.z, w.w);
    *reinterpret_cast<uint2*>(twin) = packed;
  }
}

// One element's update, as adam_quad's.
template <bool kDecoupled, bool kTwin>
__device__ __forceinline__ void adam_one(const float* p, const float* m, const float* v, float gi, float* p_out,
                                         float* m_out, float* v_out, __nv_bfloat16* twin, const AdamParams& hp) {
  float mi = *m, vi = *v;
  const float w = adam_element<kDecoupled>(*p, gi, mi, vi, hp);
  *m_out = mi;
  *v_out = vi;
  *p_out = w;
  if constexpr (kTwin) *twin = __float2bfloat16_rn(w);
}

// G: the gradient's type (float, or __nv_bfloat16 read straight from a bf16 model's gradients).
// kTwin: also write the updated value, rounded to bf16, into list 4 (the model's compute copy), so
// mixed precision needs neither float32 gradient copies nor a separate float32 -> bf16 pass.
// Memory-bound (28 bytes per parameter with twins): aligned tensors move 4 elements per access (16 B
// per float list, 8 B per bf16 list) so enough bytes are in flight per SM to cover HBM latency; the
// rest, and each tensor's last < 4 elements, go one element at a time through the same adam_element.
template <class G, bool kTwin, bool kDecoupled>
__global__ void __launch_bounds__(kThreads) adam_kernel(MultiTensorArgs args, AdamParams hp) {
  if (hp.gate) {
    if (hp.gate[0] != 0) return;
    hp.grad_scale = static_cast<float>(hp.gate[1]);
  }
  if (hp.bias_corrections) {
    hp.bias_correction1 = hp.bias_corrections[0];
    hp.bias_correction2 = hp.bias_corrections[1];
  }
  const ChunkRange c = chunk_of_block(args);
  float* p = static_cast<float*>(args.ptrs[0][c.tensor]);
  const G* g = static_cast<const G*>(args.ptrs[1][c.tensor]);
  float* m = static_cast<float*>(args.ptrs[2][c.tensor]);
  float* v = static_cast<float*>(args.ptrs[3][c.tensor]);
  __nv_bfloat16* twin = kTwin ? static_cast<__nv_bfloat16*>(args.ptrs[4][c.tensor]) : nullptr;
  auto twin_at = [&](int64_t i) { return kTwin ? twin + i : nullptr; };
  for_each_element(
      args, c,
      [&](int64_t i) {
        adam_quad<kDecoupled, kTwin>(p + i, m + i, v + i, load_grad4(g + i), p + i, m + i, v + i, twin_at(i), hp);
      },
      [&](int64_t i) {
        adam_one<kDecoupled, kTwin>(p + i, m + i, v + i, static_cast<float>(g[i]), p + i, m + i, v + i, twin_at(i), hp);
      });
}

// One SGD element update in float32 (both paths call it, as for Adam); `b` is the momentum buffer's
// value, updated in place with momentum. Momentum and Nesterov are template parameters for the same
// reason as Adam's kDecoupled: no selects inside the arithmetic.
template <bool kMomentum, bool kNesterov>
__device__ __forceinline__ float sgd_element(float w, float g, float& b, const SgdParams& hp) {
  float grad = g + hp.weight_decay * w;
  if constexpr (kMomentum) {
    b = hp.momentum * b + grad;
    grad = kNesterov ? grad + hp.momentum * b : b;
  }
  return w - hp.lr * grad;
}

// 12 bytes per parameter with momentum (8 without), 4 elements per access on aligned tensors.
template <bool kMomentum, bool kNesterov>
__global__ void __launch_bounds__(kThreads) sgd_kernel(MultiTensorArgs args, SgdParams hp) {
  const ChunkRange c = chunk_of_block(args);
  float* p = static_cast<float*>(args.ptrs[0][c.tensor]);
  const float* g = static_cast<const float*>(args.ptrs[1][c.tensor]);
  float* buf = static_cast<float*>(args.ptrs[2][c.tensor]);  // null without momentum
  for_each_element(
      args, c,
      [&](int64_t i) {
        float4 w = load4(p + i);
        const float4 gi = load4(g + i);
        float4 b = kMomentum ? load4(buf + i) : make_float4(0.f, 0.f, 0.f, 0.f);
        w.x = sgd_element<kMomentum, kNesterov>(w.x, gi.x, b.x, hp);
        w.y = sgd_element<kMomentum, kNesterov>(w.y, gi.y, b.y, hp);
        w.z = sgd_element<kMomentum, kNesterov>(w.z, gi.z, b.z, hp);
        w.w = sgd_element<kMomentum, kNesterov>(w.w, gi.w, b.w, hp);
        store4(p + i, w);
        if constexpr (kMomentum) store4(buf + i, b);
      },
      [&](int64_t i) {
        float b = kMomentum ? buf[i] : 0.f;
        p[i] = sgd_element<kMomentum, kNesterov>(p[i], g[i], b, hp);
        if constexpr (kMomentum) buf[i] = b;
      });
}

__device__ __forceinline__ float square_sum4(const float4& v) { return v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w; }

// *out = the sum of every thread's `acc` over a fixed tree (the same bits every run), in float32.
__device__ __forceinline__ void write_block_sum(float acc, double* out) {
  __shared__ float shared[kThreads];
  shared[threadIdx.x] = acc;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) shared[threadIdx.x] += shared[threadIdx.x + s];
    __syncthreads();
  }
  if (threadIdx.x == 0) *out = static_cast<double>(shared[0]);
}

// Per-block sum of squares in float32 (tree within the block, fixed order), written to
// partials[first_block + blockIdx.x]; the partials are then summed in double by one block. Memory-bound
// (2 bytes per bf16 gradient): aligned tensors are read 4 elements per access, as the updates read them.
// A whole aligned chunk issues all of a thread's loads before the first add: a thread that waited for each
// load before issuing the next kept too few bytes in flight to cover HBM latency. The adds keep the order
// of the element loop below (the same groups of 4 into the same accumulator), so the sum is the same bits.
template <class T>
__global__ void __launch_bounds__(kThreads)
    sum_squares_kernel(MultiTensorArgs args, double* partials, int first_block) {
  const ChunkRange c = chunk_of_block(args);
  const T* x = static_cast<const T*>(args.ptrs[0][c.tensor]);
  float acc = 0.f;
  if (args.vector_ok[c.tensor] && c.end - c.begin == kChunk) {
    constexpr int kLoads = kChunk / (4 * kThreads);
    float4 v[kLoads];
#pragma unroll
    for (int j = 0; j < kLoads; ++j) v[j] = load_grad4(x + c.begin + 4 * (threadIdx.x + j * kThreads));
#pragma unroll
    for (int j = 0; j < kLoads; ++j) acc += square_sum4(v[j]);
  } else {
    for_each_element(
        args, c, [&](int64_t i) { acc += square_sum4(load_grad4(x + i)); },
        [&](int64_t i) {
          const float xi = static_cast<float>(x[i]);
          acc += xi * xi;
        });
  }
  write_block_sum(acc, partials + first_block + blockIdx.x);
}

// Adam's bias corrections 1 - beta^t for step t, in double and rounded to float: every kernel that counts or
// anticipates a step writes them through here, so a replayed, a speculative and a counted step agree bit for bit.
__device__ float2 bias_corrections_at(double beta1, double beta2, int64_t t) {
  return make_float2(static_cast<float>(1.0 - pow(beta1, static_cast<double>(t))),
                     static_cast<float>(1.0 - pow(beta2, static_cast<double>(t))));
}

// Speculative AdamW through bf16 twins (fused_kernels.h, AdamSpeculation). Lists: 0 masters, 1 bf16
// gradients (null: the tensor has none this step, and its state is carried over unchanged), 2 exp_avg,
// 3 exp_avg_sq, 4 twins, then the second copies of 0, 2 and 3. Reads the copies that hold the state now and
// writes the others, so nothing that counts is overwritten before the step is decided. Each block also sums
// its gradients' squares as sum_squares_kernel does (the same adds in the same order), for the decision.
using SpeculativePack = TensorPack<8>;
static_assert(sizeof(SpeculativePack) < 32 * 1024, "kernel parameters are limited to 32 KB (CUDA 12.1+)");

template <bool kDecoupled>
__global__ void __launch_bounds__(kThreads)
    adam_speculative_kernel(SpeculativePack args, AdamParams hp, AdamSpeculation spec, int first_block) {
  // The step this update would be: the committed count plus one, corrected as adam_advance_step does.
  const float2 corrections = bias_corrections_at(spec.beta1, spec.beta2, *spec.step + 1);
  hp.bias_correction1 = corrections.x;
  hp.bias_correction2 = corrections.y;
  const ChunkRange c = chunk_of_block(args);
  const int k = c.tensor;
  const int from = *spec.current == 0 ? 0 : 1;
  auto list = [&](int first, int second, int side) {
    return static_cast<float*>(args.ptrs[side == 0 ? first : second][k]);
  };
  const float* p = list(0, 5, from);
  const float* m = list(2, 6, from);
  const float* v = list(3, 7, from);
  float* p_out = list(0, 5, 1 - from);
  float* m_out = list(2, 6, 1 - from);
  float* v_out = list(3, 7, 1 - from);
  const __nv_bfloat16* g = static_cast<const __nv_bfloat16*>(args.ptrs[1][k]);
  __nv_bfloat16* twin = static_cast<__nv_bfloat16*>(args.ptrs[4][k]);
  float acc = 0.f;
  if (g == nullptr) {
    for (int64_t i = c.begin + threadIdx.x; i < c.end; i += blockDim.x) {
      p_out[i] = p[i];
      m_out[i] = m[i];
      v_out[i] = v[i];
    }
  } else {
    for_each_element(
        args, c,
        [&](int64_t i) {
          const float4 gi = load_grad4(g + i);
          acc += square_sum4(gi);
          adam_quad<kDecoupled, true>(p + i, m + i, v + i, gi, p_out + i, m_out + i, v_out + i, twin + i, hp);
        },
        [&](int64_t i) {
          const float gi = static_cast<float>(g[i]);
          acc += gi * gi;
          adam_one<kDecoupled, true>(p + i, m + i, v + i, gi, p_out + i, m_out + i, v_out + i, twin + i, hp);
        });
  }
  write_block_sum(acc, spec.partials + first_block + blockIdx.x);
}

// A skipped speculative step wrote its twins from values that do not count: round them again from the
// masters that do (lists: masters, their second copies, twins). A kept step (almost every one) has nothing
// to do, so the grid is a few blocks a multiprocessor that stride over the chunks, not a block per chunk.
constexpr int kStridingBlocks = 264;  // two blocks of kThreads on each of 132 multiprocessors

__global__ void __launch_bounds__(kThreads)
    adam_speculation_restore_kernel(TensorPack<3> args, int chunks, const double* skip, const int* current) {
  if (*skip == 0) return;
  for (int block = static_cast<int>(blockIdx.x); block < chunks; block += static_cast<int>(gridDim.x)) {
    const ChunkRange c = chunk_of_block(args, block);
    const float* p = static_cast<const float*>(args.ptrs[*current == 0 ? 0 : 1][c.tensor]);
    __nv_bfloat16* twin = static_cast<__nv_bfloat16*>(args.ptrs[2][c.tensor]);
    for (int64_t i = c.begin + threadIdx.x; i < c.end; i += blockDim.x) twin[i] = __float2bfloat16_rn(p[i]);
  }
}

// Lists: masters, exp_avg, exp_avg_sq, then their second copies. When the second copies hold the state,
// copies it into the first.
__global__ void __launch_bounds__(kThreads) adam_speculation_settle_kernel(TensorPack<6> args, const int* current) {
  if (*current == 0) return;
  const ChunkRange c = chunk_of_block(args);
  for (int l = 0; l < 3; ++l) {
    float* dst = static_cast<float*>(args.ptrs[l][c.tensor]);
    const float* src = static_cast<const float*>(args.ptrs[l + 3][c.tensor]);
    for (int64_t i = c.begin + threadIdx.x; i < c.end; i += blockDim.x) dst[i] = src[i];
  }
}

// The sum of partials[0, n) in double, over a fixed order (each thread a strided run, then a tree): the
// value in thread 0. Every thread of the block calls it.
__device__ double block_sum_of(const double* partials, int64_t n) {
  __shared__ double shared[kThreads];
  double acc = 0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) acc += partials[i];
  shared[threadIdx.x] = acc;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) shared[threadIdx.x] += shared[threadIdx.x + s];
    __syncthreads();
  }
  return shared[0];
}

__global__ void reduce_partials_kernel(const double* partials, int64_t n, double* out) {
  const double sum = block_sum_of(partials, n);
  if (threadIdx.x == 0) *out = sum;
}

// optim/step_outcome.h's entries from the agreement and the squared gradient norm.
__device__ void write_step_outcome(const double* agreed, double sum_of_squares, double max_norm, double* out) {
  const double loss = agreed[0];
  const double norm = sqrt(sum_of_squares);
  const bool finite_norm = isfinite(norm);
  out[0] = loss;
  out[1] = agreed[1];
  out[2] = isfinite(loss) && finite_norm ? 0.0 : 1.0;
  // optim/grad_clip.cpp clip_factor, the same double arithmetic.
  out[3] = finite_norm && max_norm > 0 && norm > max_norm ? max_norm / (norm + 1e-6) : 1.0;
  out[4] = norm;
}

// A speculative step's outcome from the squares its update summed (no clipping), and for a kept step the
// count and the copies that now hold the state. One block.
__global__ void adam_speculation_resolve_kernel(const double* partials, int64_t n, const double* agreed,
                                                double* outcome, int64_t* step, float* bias_corrections, double beta1,
                                                double beta2, int* current) {
  const double sum = block_sum_of(partials, n);
  if (threadIdx.x != 0) return;
  write_step_outcome(agreed, sum, 0, outcome);
  if (outcome[2] != 0) return;
  const int64_t t = ++*step;  // as adam_advance_step counts
  const float2 corrections = bias_corrections_at(beta1, beta2, t);
  bias_corrections[0] = corrections.x;
  bias_corrections[1] = corrections.y;
  *current = 1 - *current;
}

__global__ void __launch_bounds__(kThreads) scale_kernel(MultiTensorArgs args, float factor) {
  const ChunkRange c = chunk_of_block(args);
  float* x = static_cast<float*>(args.ptrs[0][c.tensor]);
  for_each_element(
      args, c,
      [&](int64_t i) {
        float4 y = load4(x + i);
        y.x *= factor;
        y.y *= factor;
        y.z *= factor;
        y.w *= factor;
        store4(x + i, y);
      },
      [&](int64_t i) { x[i] *= factor; });
}

template <class T>
std::vector<void*> as_void(const std::vector<T*>& v) {
  std::vector<void*> out;
  out.reserve(v.size());
  for (T* p : v) out.push_back(const_cast<void*>(static_cast<const void*>(p)));
  return out;
}

void check_sizes(const char* what, size_t n, const std::vector<int64_t>& sizes) {
  DPT_CHECK(n == sizes.size(), "{}: {} pointers for {} sizes", what, n, sizes.size());
}

__global__ void adam_advance_step_kernel(int64_t* step, float* bias_corrections, double beta1, double beta2,
                                         const double* gate) {
  if (gate && gate[0] != 0) return;
  const int64_t t = ++*step;
  const float2 corrections = bias_corrections_at(beta1, beta2, t);
  bias_corrections[0] = corrections.x;
  bias_corrections[1] = corrections.y;
}

}  // namespace

void adam_advance_step(int64_t* step, float* bias_corrections, double beta1, double beta2, const double* gate) {
  adam_advance_step_kernel<<<1, 1, 0, dpt::cuda::current_stream()>>>(step, bias_corrections, beta1, beta2, gate);
  DPT_CUDA_CHECK(cudaGetLastError());
}

void adam_update(const std::vector<float*>& params, const std::vector<const float*>& grads,
                 const std::vector<float*>& exp_avg, const std::vector<float*>& exp_avg_sq,
                 const std::vector<int64_t>& sizes, const AdamParams& hp) {
  check_sizes("adam_update", params.size(), sizes);
  DPT_CHECK(grads.size() == sizes.size() && exp_avg.size() == sizes.size() && exp_avg_sq.size() == sizes.size(),
            "adam_update: lists of different lengths");
  cudaStream_t stream = dpt::cuda::current_stream();
  multi_tensor_apply(4, {as_void(params), as_void(grads), as_void(exp_avg), as_void(exp_avg_sq)}, sizes, {4, 4, 4, 4},
                     [&](const MultiTensorArgs& args, int blocks, int) {
                       if (hp.decoupled) {
                         adam_kernel<float, false, true><<<blocks, kThreads, 0, stream>>>(args, hp);
                       } else {
                         adam_kernel<float, false, false><<<blocks, kThreads, 0, stream>>>(args, hp);
                       }
                       DPT_CUDA_CHECK(cudaGetLastError());
                     });
}

void adam_update_bf16_twins(const std::vector<float*>& params, const std::vector<const void*>& grads_bf16,
                            const std::vector<float*>& exp_avg, const std::vector<float*>& exp_avg_sq,
                            const std::vector<void*>& twins_bf16, const std::vector<int64_t>& sizes,
                            const AdamParams& hp) {
  check_sizes("adam_update_bf16_twins", params.size(), sizes);
  DPT_CHECK(grads_bf16.size() == sizes.size() && exp_avg.size() == sizes.size() && exp_avg_sq.size() == sizes.size() &&
                twins_bf16.size() == sizes.size(),
            "adam_update_bf16_twins: lists of different lengths");
  cudaStream_t stream = dpt::cuda::current_stream();
  multi_tensor_apply(5, {as_void(params), as_void(grads_bf16), as_void(exp_avg), as_void(exp_avg_sq), twins_bf16},
                     sizes, {4, 2, 4, 4, 2}, [&](const MultiTensorArgs& args, int blocks, int) {
                       if (hp.decoupled) {
                         adam_kernel<__nv_bfloat16, true, true><<<blocks, kThreads, 0, stream>>>(args, hp);
                       } else {
                         adam_kernel<__nv_bfloat16, true, false><<<blocks, kThreads, 0, stream>>>(args, hp);
                       }
                       DPT_CUDA_CHECK(cudaGetLastError());
                     });
}

void adam_update_speculative(const std::vector<float*>& params, const std::vector<const void*>& grads_bf16,
                             const std::vector<float*>& exp_avg, const std::vector<float*>& exp_avg_sq,
                             const std::vector<void*>& twins_bf16, const SecondCopies& second,
                             const std::vector<int64_t>& sizes, const AdamParams& hp, const AdamSpeculation& spec,
                             int64_t first_block) {
  check_sizes("adam_update_speculative", params.size(), sizes);
  DPT_CHECK(grads_bf16.size() == sizes.size() && exp_avg.size() == sizes.size() && exp_avg_sq.size() == sizes.size() &&
                twins_bf16.size() == sizes.size() && second.params.size() == sizes.size() &&
                second.exp_avg.size() == sizes.size() && second.exp_avg_sq.size() == sizes.size(),
            "adam_update_speculative: lists of different lengths");
  cudaStream_t stream = dpt::cuda::current_stream();
  multi_tensor_apply<SpeculativePack>(
      8,
      {as_void(params), as_void(grads_bf16), as_void(exp_avg), as_void(exp_avg_sq), twins_bf16, as_void(second.params),
       as_void(second.exp_avg), as_void(second.exp_avg_sq)},
      sizes, {4, 2, 4, 4, 2, 4, 4, 4}, [&](const SpeculativePack& args, int blocks, int first) {
        const int at = static_cast<int>(first_block) + first;
        if (hp.decoupled) {
          adam_speculative_kernel<true><<<blocks, kThreads, 0, stream>>>(args, hp, spec, at);
        } else {
          adam_speculative_kernel<false><<<blocks, kThreads, 0, stream>>>(args, hp, spec, at);
        }
        DPT_CUDA_CHECK(cudaGetLastError());
      });
}

void adam_speculation_resolve(const AdamSpeculation& spec, int64_t partials, const double* agreed, double* outcome,
                              float* bias_corrections, const std::vector<float*>& params,
                              const std::vector<float*>& second_params, const std::vector<void*>& twins_bf16,
                              const std::vector<int64_t>& sizes) {
  check_sizes("adam_speculation_resolve", params.size(), sizes);
  cudaStream_t stream = dpt::cuda::current_stream();
  adam_speculation_resolve_kernel<<<1, kThreads, 0, stream>>>(spec.partials, partials, agreed, outcome, spec.step,
                                                              bias_corrections, spec.beta1, spec.beta2, spec.current);
  DPT_CUDA_CHECK(cudaGetLastError());
  // After the resolution: a skipped step left `current` as it was, at the copies that hold the state.
  multi_tensor_apply<TensorPack<3>>(
      3, {as_void(params), as_void(second_params), twins_bf16}, sizes, {4, 4, 2},
      [&](const TensorPack<3>& args, int chunks, int) {
        adam_speculation_restore_kernel<<<std::min(chunks, kStridingBlocks), kThreads, 0, stream>>>(
            args, chunks, outcome + 2, spec.current);
        DPT_CUDA_CHECK(cudaGetLastError());
      });
}

void adam_speculation_settle(const std::vector<float*>& params, const std::vector<float*>& exp_avg,
                             const std::vector<float*>& exp_avg_sq, const SecondCopies& second,
                             const std::vector<int64_t>& sizes, int* current) {
  check_sizes("adam_speculation_settle", params.size(), sizes);
  cudaStream_t stream = dpt::cuda::current_stream();
  multi_tensor_apply<TensorPack<6>>(6,
                                    {as_void(params), as_void(exp_avg), as_void(exp_avg_sq), as_void(second.params),
                                     as_void(second.exp_avg), as_void(second.exp_avg_sq)},
                                    sizes, {4, 4, 4, 4, 4, 4}, [&](const TensorPack<6>& args, int blocks, int) {
                                      adam_speculation_settle_kernel<<<blocks, kThreads, 0, stream>>>(args, current);
                                      DPT_CUDA_CHECK(cudaGetLastError());
                                    });
  DPT_CUDA_CHECK(cudaMemsetAsync(current, 0, sizeof(int), stream));  // after every block has read it
}

int64_t chunk_count(const std::vector<int64_t>& sizes) { return count_blocks(sizes); }

void sgd_update(const std::vector<float*>& params, const std::vector<const float*>& grads,
                const std::vector<float*>& momentum_buffers, const std::vector<int64_t>& sizes, const SgdParams& hp) {
  check_sizes("sgd_update", params.size(), sizes);
  const bool has_buffer = !momentum_buffers.empty();
  DPT_CHECK(grads.size() == sizes.size() && (!has_buffer || momentum_buffers.size() == sizes.size()),
            "sgd_update: lists of different lengths");
  cudaStream_t stream = dpt::cuda::current_stream();
  std::vector<void*> buffers = has_buffer ? as_void(momentum_buffers) : std::vector<void*>(sizes.size(), nullptr);
  multi_tensor_apply(3, {as_void(params), as_void(grads), buffers}, sizes, {4, 4, 4},
                     [&](const MultiTensorArgs& args, int blocks, int) {
                       if (!has_buffer) {
                         sgd_kernel<false, false><<<blocks, kThreads, 0, stream>>>(args, hp);
                       } else if (hp.nesterov) {
                         sgd_kernel<true, true><<<blocks, kThreads, 0, stream>>>(args, hp);
                       } else {
                         sgd_kernel<true, false><<<blocks, kThreads, 0, stream>>>(args, hp);
                       }
                       DPT_CUDA_CHECK(cudaGetLastError());
                     });
}

namespace {

// Enqueues one list's per-block sums of squares into partials[0, its block count).
template <class T>
void enqueue_partial_squares(const std::vector<const T*>& tensors, const std::vector<int64_t>& sizes, double* partials,
                             cudaStream_t stream) {
  const int elem_bytes = static_cast<int>(sizeof(T));
  multi_tensor_apply(1, {as_void(tensors)}, sizes, {elem_bytes},
                     [&](const MultiTensorArgs& args, int blocks, int first_block) {
                       sum_squares_kernel<T><<<blocks, kThreads, 0, stream>>>(args, partials, first_block);
                       DPT_CUDA_CHECK(cudaGetLastError());
                     });
}

std::vector<const __nv_bfloat16*> as_bf16(const std::vector<const void*>& tensors) {
  std::vector<const __nv_bfloat16*> typed;
  for (const void* t : tensors) typed.push_back(static_cast<const __nv_bfloat16*>(t));
  return typed;
}

__global__ void step_agreement_kernel(const float* loss_sum, int64_t micro_batches, const double* stop, double* out) {
  out[0] = static_cast<double>(*loss_sum) / static_cast<double>(micro_batches);
  out[1] = *stop;
}

__global__ void step_outcome_kernel(const double* agreed, const double* sum_of_squares, double max_norm, double* out) {
  write_step_outcome(agreed, *sum_of_squares, max_norm, out);
}

// Waits for the stream and returns the sum sum_of_squares_into wrote.
double sum_of_squares_now(const std::vector<const float*>& tensors, const std::vector<int64_t>& sizes,
                          const std::vector<const void*>& tensors_bf16, const std::vector<int64_t>& sizes_bf16) {
  cudaStream_t stream = dpt::cuda::current_stream();
  double* out = nullptr;
  DPT_CUDA_CHECK(cudaMallocAsync(&out, sizeof(double), stream));
  sum_of_squares_into(tensors, sizes, tensors_bf16, sizes_bf16, out);
  double result = 0;
  DPT_CUDA_CHECK(cudaMemcpyAsync(&result, out, sizeof(double), cudaMemcpyDeviceToHost, stream));
  DPT_CUDA_CHECK(cudaFreeAsync(out, stream));
  DPT_CUDA_CHECK(cudaStreamSynchronize(stream));
  return result;
}

}  // namespace

void sum_of_squares_into(const std::vector<const float*>& tensors, const std::vector<int64_t>& sizes,
                         const std::vector<const void*>& tensors_bf16, const std::vector<int64_t>& sizes_bf16,
                         double* out) {
  check_sizes("sum_of_squares", tensors.size(), sizes);
  check_sizes("sum_of_squares", tensors_bf16.size(), sizes_bf16);
  cudaStream_t stream = dpt::cuda::current_stream();
  const int64_t f32_blocks = count_blocks(sizes);
  const int64_t total_blocks = f32_blocks + count_blocks(sizes_bf16);
  if (total_blocks == 0) {
    DPT_CUDA_CHECK(cudaMemsetAsync(out, 0, sizeof(double), stream));
    return;
  }
  double* partials = nullptr;  // stream-ordered, so it is freed after the kernels finish
  DPT_CUDA_CHECK(cudaMallocAsync(&partials, static_cast<size_t>(total_blocks) * sizeof(double), stream));
  enqueue_partial_squares(tensors, sizes, partials, stream);
  enqueue_partial_squares(as_bf16(tensors_bf16), sizes_bf16, partials + f32_blocks, stream);
  reduce_partials_kernel<<<1, kThreads, 0, stream>>>(partials, total_blocks, out);
  DPT_CUDA_CHECK(cudaGetLastError());
  DPT_CUDA_CHECK(cudaFreeAsync(partials, stream));
}

double sum_of_squares(const std::vector<const float*>& tensors, const std::vector<int64_t>& sizes) {
  return sum_of_squares_now(tensors, sizes, {}, {});
}

double sum_of_squares_bf16(const std::vector<const void*>& tensors, const std::vector<int64_t>& sizes) {
  return sum_of_squares_now({}, {}, tensors, sizes);
}

void step_agreement(const float* loss_sum, int64_t micro_batches, const double* stop, double* out) {
  step_agreement_kernel<<<1, 1, 0, dpt::cuda::current_stream()>>>(loss_sum, micro_batches, stop, out);
  DPT_CUDA_CHECK(cudaGetLastError());
}

void step_outcome(const double* agreed, const double* sum_of_squares, double max_norm, double* out) {
  step_outcome_kernel<<<1, 1, 0, dpt::cuda::current_stream()>>>(agreed, sum_of_squares, max_norm, out);
  DPT_CUDA_CHECK(cudaGetLastError());
}

void scale(const std::vector<float*>& tensors, const std::vector<int64_t>& sizes, float factor) {
  check_sizes("scale", tensors.size(), sizes);
  cudaStream_t stream = dpt::cuda::current_stream();
  multi_tensor_apply(1, {as_void(tensors)}, sizes, {4}, [&](const MultiTensorArgs& args, int blocks, int) {
    scale_kernel<<<blocks, kThreads, 0, stream>>>(args, factor);
    DPT_CUDA_CHECK(cudaGetLastError());
  });
}

}  // namespace dpt::optim::cuda
