#pragma once
// Shared pieces of the CUDA kernels: dtype dispatch to device element types, conversions that round
// exactly as the CPU kernels do (core/cpu/dispatch.h), warp/block reductions and launch sizes.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "core/cuda/check.h"
#include "core/cuda/stream.h"
#include "core/dtype.h"
#include "core/dtype_visit.h"
#include "core/error.h"
#include "core/tensor.h"

namespace dpt::cuda_kernels {

using bf16_t = __nv_bfloat16;
using f16_t = __half;

// True for the 16-bit floating types, which are stored narrow and computed in float.
template <class T>
constexpr bool kIsHalfWidth = std::is_same_v<T, bf16_t> || std::is_same_v<T, f16_t>;

// Arithmetic type of an element type: float for bfloat16 and float16 (rounded once, on store), itself
// otherwise.
template <class T>
using Compute = std::conditional_t<kIsHalfWidth<T>, float, T>;

// Any element type to any other: integers and floats directly, bfloat16 and float16 through float32
// (so float64 -> bf16 rounds twice, exactly like dpt::bf16(float(x)) on the host; f16 likewise).
template <class To, class From>
__host__ __device__ __forceinline__ To convert(From v) {
  if constexpr (std::is_same_v<To, From>) {
    return v;
  } else if constexpr (std::is_same_v<To, bf16_t>) {
    return __float2bfloat16_rn(static_cast<float>(v));
  } else if constexpr (std::is_same_v<To, f16_t>) {
    return __float2half_rn(static_cast<float>(v));
  } else if constexpr (std::is_same_v<From, bf16_t>) {
    return static_cast<To>(__bfloat162float(v));
  } else if constexpr (std::is_same_v<From, f16_t>) {
    return static_cast<To>(__half2float(v));
  } else {
    return static_cast<To>(v);
  }
}

// --- host-side dtype dispatch: f receives a value of the device element type ----------------------

template <class F>
decltype(auto) visit_floating(DType dtype, const char* what, F&& f) {
  return dtype_visit::floating<bf16_t, f16_t>(dtype, what, " (CUDA)", std::forward<F>(f));
}

template <class F>
decltype(auto) visit_all(DType dtype, F&& f) {
  return dtype_visit::all<bf16_t, f16_t>(dtype, std::forward<F>(f));
}

template <class F>
decltype(auto) visit_index(DType dtype, const char* what, F&& f) {
  return dtype_visit::index(dtype, what, " (CUDA)", std::forward<F>(f));
}

template <class T>
T* ptr(const Tensor& t) {
  return static_cast<T*>(t.data_ptr());
}

// All tensors of a kernel call must live on the same CUDA device; returns it.
inline int device_of(const Tensor& out, std::initializer_list<const Tensor*> inputs, const char* what) {
  DPT_CHECK(out.device().is_cuda(), "{} (CUDA): output is on {}", what, out.device().str());
  for (const Tensor* t : inputs) {
    if (t && t->defined()) {
      DPT_CHECK(t->device() == out.device(), "{} (CUDA): operand on {} but output on {}", what, t->device().str(),
                out.device().str());
    }
  }
  return out.device().index;
}

// --- launch sizes --------------------------------------------------------------------------------

constexpr int kThreads = 256;

int sm_count(int device);

// Blocks for a grid-stride loop over n items: enough to fill the device a few times over, never more
// than the work needs.
inline unsigned grid_for(int64_t n, int device, int threads = kThreads) {
  int64_t want = (n + threads - 1) / threads;
  int64_t cap = static_cast<int64_t>(sm_count(device)) * 32;
  if (want > cap) want = cap;
  if (want < 1) want = 1;
  return static_cast<unsigned>(want);
}

// 16-byte vector of N elements, for vectorised loads and stores.
template <class T, int N>
struct alignas(sizeof(T) * N) Vec {
  T v[N];
};

template <class T>
constexpr int vec_width() {
  return 16 / static_cast<int>(sizeof(T));
}

inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

// --- reductions within a warp and a block ----------------------------------------------------------

template <class C>
__device__ __forceinline__ C warp_sum(C v) {
  for (int s = 16; s > 0; s >>= 1) v += __shfl_xor_sync(0xffffffffu, v, s);
  return v;
}

template <class C>
__device__ __forceinline__ C warp_max(C v) {
  for (int s = 16; s > 0; s >>= 1) v = max(v, __shfl_xor_sync(0xffffffffu, v, s));
  return v;
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets the result.
// `scratch` holds 32 values; the function synchronises before reusing it, so back-to-back calls are safe.
template <class C>
__device__ __forceinline__ C block_sum(C v, C* scratch) {
  v = warp_sum(v);
  if (blockDim.x == 32) return v;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < warps ? scratch[lane] : C(0);
  return warp_sum(v);
}

template <class C>
__device__ __forceinline__ C block_max(C v, C* scratch) {
  v = warp_max(v);
  if (blockDim.x == 32) return v;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < warps ? scratch[lane] : scratch[0];
  return warp_max(v);
}

// Threads per block for a row of n elements handled by one block.
inline int row_threads(int64_t n, int vec = 1) {
  int64_t per = (n + vec - 1) / vec;
  int threads = 32;
  while (threads < 1024 && threads < per) threads *= 2;
  return threads;
}

}  // namespace dpt::cuda_kernels

namespace dpt::cuda_kernels {

// Scratch memory for a kernel call, from the stream-ordered pool: allocated and freed on the current
// stream, so freeing right after the launches that use it is safe (the free is ordered after them).
class DeviceBuffer {
 public:
  DeviceBuffer(size_t nbytes, int device);
  ~DeviceBuffer();
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  template <class T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }

 private:
  void* ptr_ = nullptr;
  size_t nbytes_ = 0;
  int device_ = 0;
};

}  // namespace dpt::cuda_kernels

namespace dpt::cuda_kernels {

// --- rows with 16-byte vectors in their aligned middle ----------------------------------------------
// A row that starts at an arbitrary element (e.g. row r of [rows, 50257]) is split into a scalar head
// up to the first 16-byte boundary, V-element vectors, and a scalar tail. With V == 1 everything is
// scalar. Threads `tid` of `nthreads` share the row; visits are in no particular order.
//
// A thread loads kRowBatch of its vectors before it uses any of them. One 16-byte load in flight per
// thread is too few to cover device-memory latency on a long row (a vocabulary) when the use of each
// element depends on the last (the online max/sum). The order in which a thread applies f is that of
// the plain loop, so the results are bitwise the same.
constexpr int kRowBatch = 4;

template <int V, class T>
__device__ __forceinline__ int64_t row_head(const T* p, int64_t n) {
  if constexpr (V == 1) {
    return 0;
  } else {
    const int64_t mis = static_cast<int64_t>((reinterpret_cast<uintptr_t>(p) / sizeof(T)) % V);
    const int64_t head = mis == 0 ? 0 : V - mis;
    return head < n ? head : n;
  }
}

// f(j, p[j]) for every j in [0, n).
template <int V, class T, class F>
__device__ __forceinline__ void row_visit(const T* __restrict__ p, int64_t n, int tid, int nthreads, F&& f) {
  const int64_t head = row_head<V>(p, n);
  for (int64_t j = tid; j < head; j += nthreads) f(j, p[j]);
  const int64_t nv = (n - head) / V;
  const auto* pv = reinterpret_cast<const Vec<T, V>*>(p + head);
  auto use = [&](int64_t k, const Vec<T, V>& v) {
#pragma unroll
    for (int q = 0; q < V; ++q) f(head + k * V + q, v.v[q]);
  };
  int64_t k = tid;
  for (; k + (kRowBatch - 1) * static_cast<int64_t>(nthreads) < nv; k += kRowBatch * static_cast<int64_t>(nthreads)) {
    Vec<T, V> v[kRowBatch];
#pragma unroll
    for (int b = 0; b < kRowBatch; ++b) v[b] = pv[k + b * nthreads];
#pragma unroll
    for (int b = 0; b < kRowBatch; ++b) use(k + b * nthreads, v[b]);
  }
  for (; k < nv; k += nthreads) use(k, pv[k]);
  for (int64_t j = head + nv * V + tid; j < n; j += nthreads) f(j, p[j]);
}

// out[j] = f(j, a[j]) for every j; `out` must share `a`'s alignment modulo 16 bytes (host-checked).
// `out` may be `a` (an in-place map): each element is loaded by the thread that stores it, before the store.
// Reverse walks the row from its end: right after a forward pass over the same row (row_visit), the
// elements read last are the likeliest still in L2, so they are read first.
template <int V, bool Reverse = false, class T, class U, class F>
__device__ __forceinline__ void row_map(const T* a, U* out, int64_t n, int tid, int nthreads, F&& f) {
  const int64_t head = row_head<V>(a, n);
  const int64_t nv = (n - head) / V;
  const auto* av = reinterpret_cast<const Vec<T, V>*>(a + head);
  auto* ov = reinterpret_cast<Vec<U, V>*>(out + head);
  auto store = [&](int64_t k, const Vec<T, V>& v) {
    Vec<U, V> r;
#pragma unroll
    for (int q = 0; q < V; ++q) r.v[q] = f(head + k * V + q, v.v[q]);
    ov[k] = r;
  };
  // kRowBatch vectors loaded, then mapped and stored in order; `step` is nthreads or -nthreads. In place,
  // every element is still loaded by the thread that stores it, before the store.
  auto vectors = [&](int64_t k, int64_t step, auto in_range) {
    for (; in_range(k + (kRowBatch - 1) * step); k += kRowBatch * step) {
      Vec<T, V> v[kRowBatch];
#pragma unroll
      for (int b = 0; b < kRowBatch; ++b) v[b] = av[k + b * step];
#pragma unroll
      for (int b = 0; b < kRowBatch; ++b) store(k + b * step, v[b]);
    }
    for (; in_range(k); k += step) store(k, av[k]);
  };
  if constexpr (Reverse) {
    for (int64_t j = n - 1 - tid; j >= head + nv * V; j -= nthreads) out[j] = f(j, a[j]);
    vectors(nv - 1 - tid, -static_cast<int64_t>(nthreads), [](int64_t k) { return k >= 0; });
    for (int64_t j = head - 1 - tid; j >= 0; j -= nthreads) out[j] = f(j, a[j]);
  } else {
    for (int64_t j = tid; j < head; j += nthreads) out[j] = f(j, a[j]);
    vectors(tid, nthreads, [nv](int64_t k) { return k < nv; });
    for (int64_t j = head + nv * V + tid; j < n; j += nthreads) out[j] = f(j, a[j]);
  }
}

// out[j] = f(j, a[j], b[j]); all three share alignment modulo 16 bytes (host-checked).
template <int V, class T, class F>
__device__ __forceinline__ void row_map2(const T* __restrict__ a, const T* __restrict__ b, T* __restrict__ out,
                                         int64_t n, int tid, int nthreads, F&& f) {
  const int64_t head = row_head<V>(a, n);
  for (int64_t j = tid; j < head; j += nthreads) out[j] = f(j, a[j], b[j]);
  const int64_t nv = (n - head) / V;
  const auto* av = reinterpret_cast<const Vec<T, V>*>(a + head);
  const auto* bv = reinterpret_cast<const Vec<T, V>*>(b + head);
  auto* ov = reinterpret_cast<Vec<T, V>*>(out + head);
  for (int64_t k = tid; k < nv; k += nthreads) {
    const Vec<T, V> x = av[k], y = bv[k];
    Vec<T, V> r;
#pragma unroll
    for (int q = 0; q < V; ++q) r.v[q] = f(head + k * V + q, x.v[q], y.v[q]);
    ov[k] = r;
  }
  for (int64_t j = head + nv * V + tid; j < n; j += nthreads) out[j] = f(j, a[j], b[j]);
}

// True when every pointer has the same address modulo 16 bytes, so one head length fits all rows.
inline bool same_alignment(std::initializer_list<const void*> ptrs) {
  uintptr_t first = 0;
  bool have = false;
  for (const void* p : ptrs) {
    const uintptr_t m = reinterpret_cast<uintptr_t>(p) & 15;
    if (have && m != first) return false;
    first = m;
    have = true;
  }
  return true;
}

}  // namespace dpt::cuda_kernels

namespace dpt::cuda_kernels {

// f(j, a[j], b[j]) for every j; a and b share alignment modulo 16 bytes (host-checked).
template <int V, class T, class F>
__device__ __forceinline__ void row_visit2(const T* __restrict__ a, const T* __restrict__ b, int64_t n, int tid,
                                           int nthreads, F&& f) {
  const int64_t head = row_head<V>(a, n);
  for (int64_t j = tid; j < head; j += nthreads) f(j, a[j], b[j]);
  const int64_t nv = (n - head) / V;
  const auto* av = reinterpret_cast<const Vec<T, V>*>(a + head);
  const auto* bv = reinterpret_cast<const Vec<T, V>*>(b + head);
  for (int64_t k = tid; k < nv; k += nthreads) {
    const Vec<T, V> x = av[k], y = bv[k];
#pragma unroll
    for (int q = 0; q < V; ++q) f(head + k * V + q, x.v[q], y.v[q]);
  }
  for (int64_t j = head + nv * V + tid; j < n; j += nthreads) f(j, a[j], b[j]);
}

}  // namespace dpt::cuda_kernels
