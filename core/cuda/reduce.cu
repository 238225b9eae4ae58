// Sum and max over the middle dim of a contiguous [outer, n, inner] view.
//
// Accumulation is in double for floating types (int64 for integers), like the CPU kernel, and the
// order of additions is fixed by the launch shape alone, so results are deterministic run to run.
// Two layouts:
//   inner == 1  rows of n contiguous elements: one block per (row, chunk) reads it with 16-byte vectors
//               (scalar head and tail), reduced in the block with warp shuffles;
//   inner  > 1  one thread per output column (o, i) walking j with stride `inner`: neighbouring
//               threads read neighbouring addresses, so every load is coalesced.
// When there are too few rows/columns to fill the GPU, the reduced dim is split into chunks; each
// chunk writes a partial and a second small kernel combines the partials in chunk order.
// Max keeps (value, index) pairs and resolves ties to the smaller index: the first maximum wins.
#include <algorithm>
#include <memory>

#include "core/cuda/cuda_kernels.h"
#include "core/cuda/kernel_utils.cuh"

namespace dpt::cuda_kernels {

namespace {

template <class T>
using Acc = std::conditional_t<std::is_integral_v<T>, int64_t, double>;

// (v2, i2) replaces (v, i) when it is a larger value, or an equal one seen earlier; i < 0 is "empty".
template <class A>
__device__ __forceinline__ void combine_max(A& v, int64_t& i, A v2, int64_t i2) {
  if (i2 >= 0 && (i < 0 || v2 > v || (v2 == v && i2 < i))) {
    v = v2;
    i = i2;
  }
}

// Block-wide reductions; every thread of the block gets the result. Shared scratch is passed in.
template <class A>
__device__ A block_sum_acc(A v, A* scratch) {
  return block_sum(v, scratch);
}

template <class A>
__device__ void block_max_pair(A& v, int64_t& i, A* sv, int64_t* si) {
  for (int s = 16; s > 0; s >>= 1) {
    A v2 = __shfl_xor_sync(0xffffffffu, v, s);
    int64_t i2 = __shfl_xor_sync(0xffffffffu, i, s);
    combine_max(v, i, v2, i2);
  }
  if (blockDim.x == 32) return;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  __syncthreads();
  if (lane == 0) {
    sv[warp] = v;
    si[warp] = i;
  }
  __syncthreads();
  if (lane < warps) {
    v = sv[lane];
    i = si[lane];
  } else {
    i = -1;
  }
  for (int s = 16; s > 0; s >>= 1) {
    A v2 = __shfl_xor_sync(0xffffffffu, v, s);
    int64_t i2 = __shfl_xor_sync(0xffffffffu, i, s);
    combine_max(v, i, v2, i2);
  }
}

// Where a (row or column, chunk) result goes: the output when there is one chunk, else the partials
// laid out [slot][chunk].
template <class T, ReduceOp Op>
__device__ __forceinline__ void store_result(int64_t slot, int chunk, int chunks, Acc<T> v, int64_t idx, T* out,
                                             int64_t* indices, Acc<T>* part_v, int64_t* part_i) {
  if (chunks == 1) {
    out[slot] = convert<T>(v);
    if (Op == ReduceOp::Max && indices) indices[slot] = idx;
  } else {
    part_v[slot * chunks + chunk] = v;
    if (Op == ReduceOp::Max) part_i[slot * chunks + chunk] = idx;
  }
}

template <class T, ReduceOp Op>
__global__ void __launch_bounds__(512)
    reduce_rows_kernel(const T* __restrict__ in, int64_t n, int64_t chunk_len, int chunks, T* __restrict__ out,
                       int64_t* __restrict__ indices, Acc<T>* __restrict__ part_v, int64_t* __restrict__ part_i) {
  using A = Acc<T>;
  __shared__ A sv[32];
  __shared__ int64_t si[32];
  const int64_t row = blockIdx.x;
  const int chunk = blockIdx.y;
  const int64_t begin = chunk * chunk_len;
  const int64_t end = min(n, begin + chunk_len);
  const T* x = in + row * n;
  if constexpr (Op == ReduceOp::Sum) {
    A acc = 0;
    row_visit<vec_width<T>()>(x + begin, end - begin, threadIdx.x, blockDim.x,
                              [&](int64_t, T v) { acc += convert<A>(v); });
    acc = block_sum_acc(acc, sv);
    if (threadIdx.x == 0) store_result<T, Op>(row, chunk, chunks, acc, 0, out, indices, part_v, part_i);
  } else {
    A best = 0;
    int64_t best_j = -1;
    row_visit<vec_width<T>()>(x + begin, end - begin, threadIdx.x, blockDim.x,
                              [&](int64_t j, T v) { combine_max(best, best_j, convert<A>(v), begin + j); });
    block_max_pair(best, best_j, sv, si);
    if (threadIdx.x == 0) store_result<T, Op>(row, chunk, chunks, best, best_j, out, indices, part_v, part_i);
  }
}

template <class T, ReduceOp Op>
__global__ void reduce_cols_kernel(const T* __restrict__ in, int64_t cols, int64_t n, int64_t inner, int64_t chunk_len,
                                   int chunks, T* __restrict__ out, int64_t* __restrict__ indices,
                                   Acc<T>* __restrict__ part_v, int64_t* __restrict__ part_i) {
  using A = Acc<T>;
  const int64_t col = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (col >= cols) return;
  const int chunk = blockIdx.y;
  const int64_t o = col / inner, i = col % inner;
  const int64_t begin = chunk * chunk_len;
  const int64_t end = min(n, begin + chunk_len);
  const T* x = in + o * n * inner + i;
  if constexpr (Op == ReduceOp::Sum) {
    A acc = 0;
    for (int64_t j = begin; j < end; ++j) acc += convert<A>(x[j * inner]);
    store_result<T, Op>(col, chunk, chunks, acc, 0, out, indices, part_v, part_i);
  } else {
    A best = 0;
    int64_t best_j = -1;
    for (int64_t j = begin; j < end; ++j) combine_max(best, best_j, convert<A>(x[j * inner]), j);
    store_result<T, Op>(col, chunk, chunks, best, best_j, out, indices, part_v, part_i);
  }
}

// Sum over the middle dim for inner > 1 with 16-byte vectors: block (32, kColRows) covers 32 * V
// neighbouring columns of one chunk of the reduced dim; thread (tx, ty) loads V columns at a time from
// rows begin + ty, begin + ty + kColRows, ... (a warp reads 32 consecutive vectors), then the block adds
// its kColRows row-lane sums of each column in ty order. Partials are laid out [chunk][slot], so the
// finish kernel reads them coalesced. Needs inner % V == 0 and a 16-byte aligned input.
constexpr int kColRows = 8;

template <class T, int V>
__global__ void __launch_bounds__(32 * kColRows)
    reduce_cols_sum_vec_kernel(const T* __restrict__ in, int64_t slots, int64_t n, int64_t inner, int64_t chunk_len,
                               int chunks, T* __restrict__ out, Acc<T>* __restrict__ part) {
  using A = Acc<T>;
  __shared__ A lanes[kColRows][32 * V];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t col = (static_cast<int64_t>(blockIdx.x) * 32 + tx) * V;  // first of this thread's V columns
  const int chunk = blockIdx.y;
  const int64_t begin = chunk * chunk_len;
  const int64_t end = min(n, begin + chunk_len);
  A acc[V];
#pragma unroll
  for (int q = 0; q < V; ++q) acc[q] = 0;
  if (col < slots) {
    const int64_t o = col / inner, i = col % inner;
    const T* x = in + o * n * inner + i;
#pragma unroll 4
    for (int64_t j = begin + ty; j < end; j += kColRows) {
      const Vec<T, V> v = *reinterpret_cast<const Vec<T, V>*>(x + j * inner);
#pragma unroll
      for (int q = 0; q < V; ++q) acc[q] += convert<A>(v.v[q]);
    }
  }
#pragma unroll
  for (int q = 0; q < V; ++q) lanes[ty][tx * V + q] = acc[q];
  __syncthreads();
  for (int c = ty * 32 + tx; c < 32 * V; c += 32 * kColRows) {
    const int64_t slot = static_cast<int64_t>(blockIdx.x) * 32 * V + c;
    if (slot >= slots) continue;
    A total = 0;
    for (int l = 0; l < kColRows; ++l) total += lanes[l][c];
    if (chunks == 1) {
      out[slot] = convert<T>(total);
    } else {
      part[static_cast<int64_t>(chunk) * slots + slot] = total;
    }
  }
}

// out[slot] = sum over chunks of part[chunk][slot]. Block (32, kFinishLanes): thread (tx, ty) adds
// chunks ty, ty + kFinishLanes, ... of slot tx (coalesced across tx), then thread (tx, 0) adds the
// lanes in ty order.
constexpr int kFinishLanes = 16;

template <class T>
__global__ void __launch_bounds__(32 * kFinishLanes)
    reduce_cols_finish_kernel(const Acc<T>* __restrict__ part, int chunks, int64_t slots, T* __restrict__ out) {
  using A = Acc<T>;
  __shared__ A lanes[kFinishLanes][33];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t slot = static_cast<int64_t>(blockIdx.x) * 32 + tx;
  A acc = 0;
  if (slot < slots) {
    for (int c = ty; c < chunks; c += kFinishLanes) acc += part[static_cast<int64_t>(c) * slots + slot];
  }
  lanes[ty][tx] = acc;
  __syncthreads();
  if (ty == 0 && slot < slots) {
    for (int l = 1; l < kFinishLanes; ++l) acc += lanes[l][tx];
    out[slot] = convert<T>(acc);
  }
}

// Combines the partials of each slot in chunk order.
template <class T, ReduceOp Op>
__global__ void reduce_finish_kernel(int64_t slots, int chunks, const Acc<T>* __restrict__ part_v,
                                     const int64_t* __restrict__ part_i, T* __restrict__ out,
                                     int64_t* __restrict__ indices) {
  using A = Acc<T>;
  const int64_t slot = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (slot >= slots) return;
  const A* pv = part_v + slot * chunks;
  if constexpr (Op == ReduceOp::Sum) {
    A acc = 0;
    for (int c = 0; c < chunks; ++c) acc += pv[c];
    out[slot] = convert<T>(acc);
  } else {
    const int64_t* pi = part_i + slot * chunks;
    A best = 0;
    int64_t best_j = -1;
    for (int c = 0; c < chunks; ++c) combine_max(best, best_j, pv[c], pi[c]);
    out[slot] = convert<T>(best);
    if (indices) indices[slot] = best_j;
  }
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The bias-gradient shape: [outer, n, inner] summed over n with inner a multiple of the vector width.
// Returns false (nothing launched) when the vector path does not apply.
template <class T>
bool reduce_cols_sum_vec(const T* x, int64_t outer, int64_t n, int64_t inner, T* y, int device) {
  if constexpr (!(std::is_floating_point_v<T> || kIsHalfWidth<T>)) {
    (void)x, (void)outer, (void)n, (void)inner, (void)y, (void)device;
    return false;
  } else {
    constexpr int V = vec_width<T>();
    if (inner % V != 0 || !aligned16(x)) return false;
    using A = Acc<T>;
    cudaStream_t stream = cuda::current_stream(device);
    const int64_t slots = outer * inner;
    const int64_t col_blocks = ceil_div(slots, 32 * V);
    // Enough blocks for a few per SM; each chunk keeps at least 4 rows per row lane.
    const int64_t want = ceil_div(4 * static_cast<int64_t>(sm_count(device)), col_blocks);
    int64_t chunks = std::clamp<int64_t>(std::min(want, ceil_div(n, 4 * kColRows)), 1, 65535);
    const int64_t chunk_len = ceil_div(n, chunks);
    chunks = ceil_div(n, chunk_len);
    std::unique_ptr<DeviceBuffer> part;
    if (chunks > 1) part = std::make_unique<DeviceBuffer>(sizeof(A) * slots * chunks, device);
    dim3 grid(static_cast<unsigned>(col_blocks), static_cast<unsigned>(chunks));
    reduce_cols_sum_vec_kernel<T, V><<<grid, dim3(32, kColRows), 0, stream>>>(
        x, slots, n, inner, chunk_len, static_cast<int>(chunks), y, part ? part->as<A>() : nullptr);
    DPT_CUDA_CHECK_LAUNCH();
    if (chunks > 1) {
      reduce_cols_finish_kernel<T><<<static_cast<unsigned>(ceil_div(slots, 32)), dim3(32, kFinishLanes), 0, stream>>>(
          part->as<A>(), static_cast<int>(chunks), slots, y);
      DPT_CUDA_CHECK_LAUNCH();
    }
    return true;
  }
}

template <class T, ReduceOp Op>
void reduce_typed(const Tensor& in, int64_t outer, int64_t n, int64_t inner, const Tensor& out, const Tensor& indices,
                  int device) {
  using A = Acc<T>;
  cudaStream_t stream = cuda::current_stream(device);
  const T* x = ptr<const T>(in);
  T* y = ptr<T>(out);
  if (Op == ReduceOp::Sum && inner > 1 && reduce_cols_sum_vec<T>(x, outer, n, inner, y, device)) return;
  int64_t* idx = indices.defined() ? ptr<int64_t>(indices) : nullptr;
  const int64_t sms = sm_count(device);
  const bool rows = inner == 1;
  const int64_t slots = outer * inner;
  // Split the reduced dim only when the slots alone cannot keep every SM busy.
  int64_t chunks = 1;
  if (rows) {
    if (outer < 2 * sms) chunks = std::min(ceil_div(n, 4096), ceil_div(4 * sms, outer));
  } else {
    const int64_t target_threads = sms * 2048;
    if (slots < target_threads) chunks = std::min(ceil_div(n, 64), target_threads / slots);
  }
  chunks = std::clamp<int64_t>(chunks, 1, 65535);
  const int64_t chunk_len = ceil_div(n, chunks);
  chunks = ceil_div(n, chunk_len);

  A* part_v = nullptr;
  int64_t* part_i = nullptr;
  std::unique_ptr<DeviceBuffer> part_v_buf, part_i_buf;
  if (chunks > 1) {
    part_v_buf = std::make_unique<DeviceBuffer>(sizeof(A) * slots * chunks, device);
    part_v = part_v_buf->as<A>();
    if (Op == ReduceOp::Max) {
      part_i_buf = std::make_unique<DeviceBuffer>(sizeof(int64_t) * slots * chunks, device);
      part_i = part_i_buf->as<int64_t>();
    }
  }
  if (rows) {
    const int threads = std::min(row_threads(chunk_len), 512);
    dim3 grid(static_cast<unsigned>(outer), static_cast<unsigned>(chunks));
    reduce_rows_kernel<T, Op>
        <<<grid, threads, 0, stream>>>(x, n, chunk_len, static_cast<int>(chunks), y, idx, part_v, part_i);
  } else {
    dim3 grid(static_cast<unsigned>(ceil_div(slots, kThreads)), static_cast<unsigned>(chunks));
    reduce_cols_kernel<T, Op><<<grid, kThreads, 0, stream>>>(x, slots, n, inner, chunk_len, static_cast<int>(chunks), y,
                                                             idx, part_v, part_i);
  }
  DPT_CUDA_CHECK_LAUNCH();
  if (chunks > 1) {
    reduce_finish_kernel<T, Op><<<static_cast<unsigned>(ceil_div(slots, kThreads)), kThreads, 0, stream>>>(
        slots, static_cast<int>(chunks), part_v, part_i, y, idx);
    DPT_CUDA_CHECK_LAUNCH();
  }
}

template <class T>
__global__ void max_backward_kernel(const T* __restrict__ grad, const int64_t* __restrict__ indices, int64_t slots,
                                    int64_t n, int64_t inner, T* __restrict__ grad_in) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t s = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; s < slots; s += stride) {
    const int64_t o = s / inner, i = s % inner;
    grad_in[(o * n + indices[s]) * inner + i] = grad[s];
  }
}

}  // namespace

void reduce(ReduceOp op, const Tensor& in, int64_t outer, int64_t n, int64_t inner, const Tensor& out,
            const Tensor& indices) {
  DPT_CHECK(in.is_contiguous() && out.is_contiguous() && in.numel() == outer * n * inner &&
                out.numel() == outer * inner && in.dtype() == out.dtype(),
            "reduce kernel (CUDA): input {} {} does not view as [{}, {}, {}] into output {} {}", shape_str(in.shape()),
            dtype_name(in.dtype()), outer, n, inner, shape_str(out.shape()), dtype_name(out.dtype()));
  if (indices.defined()) {
    DPT_CHECK(indices.dtype() == DType::Int64 && indices.numel() == outer * inner && indices.is_contiguous(),
              "reduce kernel (CUDA): indices must be contiguous int64 with {} elements", outer * inner);
  }
  DPT_CHECK(op == ReduceOp::Sum || n > 0, "reduce kernel (CUDA): max over an empty dimension");
  const int device = device_of(out, {&in, &indices}, "reduce kernel");
  if (out.numel() == 0) return;
  if (n == 0) {
    fill(out, 0.0);  // the empty sum
    return;
  }
  cuda::DeviceGuard guard(device);
  visit_all(out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    if (op == ReduceOp::Sum) {
      reduce_typed<T, ReduceOp::Sum>(in, outer, n, inner, out, indices, device);
    } else {
      reduce_typed<T, ReduceOp::Max>(in, outer, n, inner, out, indices, device);
    }
  });
}

void max_backward(const Tensor& grad, const Tensor& indices, int64_t outer, int64_t n, int64_t inner,
                  const Tensor& grad_in) {
  DPT_CHECK(grad.is_contiguous() && indices.is_contiguous() && grad_in.is_contiguous() &&
                grad.numel() == outer * inner && grad_in.numel() == outer * n * inner &&
                indices.dtype() == DType::Int64 && grad.dtype() == grad_in.dtype(),
            "max_backward kernel (CUDA): grad {} and indices {} do not fit grad_in {} as [{}, {}, {}]",
            shape_str(grad.shape()), shape_str(indices.shape()), shape_str(grad_in.shape()), outer, n, inner);
  const int device = device_of(grad_in, {&grad, &indices}, "max_backward kernel");
  const int64_t slots = outer * inner;
  if (slots == 0) return;
  cuda::DeviceGuard guard(device);
  // grad_in is written only at the argmax positions; the caller zero-fills it (as on the CPU).
  visit_floating(grad_in.dtype(), "max_backward", [&](auto tag) {
    using T = decltype(tag);
    max_backward_kernel<T><<<grid_for(slots, device), kThreads, 0, cuda::current_stream(device)>>>(
        ptr<const T>(grad), ptr<const int64_t>(indices), slots, n, inner, ptr<T>(grad_in));
    DPT_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace dpt::cuda_kernels
