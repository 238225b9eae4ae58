// Row-wise softmax / log-softmax over the last dim, and their backward. Statistics are in float32 for
// bfloat16 and float32 inputs (float64 for float64), as on the CPU. Forward reads each row twice: one
// pass for the online (max, sum exp) pair, one to write; backward reads twice: one dot product
// (sum(gy * y), or sum(gy) for the log form), one to write. Rows of up to 1024 elements get one warp
// each, longer rows one block each; loads are 16-byte vectors when rows are aligned.
#include <algorithm>

#include "core/cuda/cuda_kernels.h"
#include "core/cuda/row_reduce.cuh"

namespace dpt::cuda_kernels {

namespace {

template <class T, int V, bool WarpRow, bool Log>
__global__ void __launch_bounds__(1024)
    softmax_kernel(const T* __restrict__ in, T* __restrict__ out, int64_t rows, int64_t n) {
  using C = Compute<T>;
  __shared__ C scratch_m[32], scratch_s[32];
  const RowSlot<WarpRow> slot;
  if (slot.row >= rows) return;  // whole warps only (warp rows); block rows never take this branch
  const auto* x = reinterpret_cast<const Vec<T, V>*>(in + slot.row * n);
  auto* y = reinterpret_cast<Vec<T, V>*>(out + slot.row * n);
  const int64_t nv = n / V;
  C m = neg_inf<C>(), s = 0;
  for (int64_t j = slot.tid; j < nv; j += slot.nthreads) {
    Vec<T, V> v = x[j];
#pragma unroll
    for (int k = 0; k < V; ++k) online_add(m, s, convert<C>(v.v[k]));
  }
  row_online<WarpRow>(m, s, scratch_m, scratch_s);
  const C lse = m + fast_log(s);
  const C inv = C(1) / s;
  for (int64_t j = slot.tid; j < nv; j += slot.nthreads) {
    Vec<T, V> v = x[j], r;
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const C c = convert<C>(v.v[k]);
      r.v[k] = convert<T>(Log ? c - lse : fast_exp(c - m) * inv);
    }
    y[j] = r;
  }
}

template <class T, int V, bool WarpRow, bool Log>
__global__ void __launch_bounds__(1024)
    softmax_backward_kernel(const T* __restrict__ grad_out, const T* __restrict__ out, T* __restrict__ grad_in,
                            int64_t rows, int64_t n) {
  using C = Compute<T>;
  __shared__ C scratch[32];
  const RowSlot<WarpRow> slot;
  if (slot.row >= rows) return;
  const auto* gy = reinterpret_cast<const Vec<T, V>*>(grad_out + slot.row * n);
  const auto* y = reinterpret_cast<const Vec<T, V>*>(out + slot.row * n);
  auto* gx = reinterpret_cast<Vec<T, V>*>(grad_in + slot.row * n);
  const int64_t nv = n / V;
  C dot = 0;
  for (int64_t j = slot.tid; j < nv; j += slot.nthreads) {
    Vec<T, V> g = gy[j], p;
    if constexpr (!Log) p = y[j];
#pragma unroll
    for (int k = 0; k < V; ++k) dot += Log ? convert<C>(g.v[k]) : convert<C>(g.v[k]) * convert<C>(p.v[k]);
  }
  dot = row_sum<WarpRow>(dot, scratch);
  for (int64_t j = slot.tid; j < nv; j += slot.nthreads) {
    Vec<T, V> g = gy[j], p = y[j], r;
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const C gc = convert<C>(g.v[k]), pc = convert<C>(p.v[k]);
      // log form: y = log p, gx = gy - p * sum(gy); plain form: gx = p * (gy - sum(gy * p)).
      r.v[k] = convert<T>(Log ? gc - fast_exp(pc) * dot : pc * (gc - dot));
    }
    gx[j] = r;
  }
}

// Picks vector width and row layout, then launches `kernel<T, V, WarpRow, Log>`.
template <class T, bool Log, bool Backward>
void launch_rows(const void* a, const void* b, void* out, int64_t rows, int64_t n, int device) {
  constexpr int kV = vec_width<T>();
  const bool vec = n % kV == 0 && aligned16(a) && aligned16(out) && (b == nullptr || aligned16(b));
  const bool warp_row = n <= kWarpRowMax;
  cudaStream_t stream = cuda::current_stream(device);
  auto go = [&](auto v_tag, auto warp_tag) {
    constexpr int V = decltype(v_tag)::value;
    constexpr bool W = decltype(warp_tag)::value;
    const unsigned grid =
        W ? static_cast<unsigned>((rows + kWarpRowsPerBlock - 1) / kWarpRowsPerBlock) : static_cast<unsigned>(rows);
    const int threads = W ? 32 * kWarpRowsPerBlock : std::min(row_threads(n, V), 1024);
    if constexpr (Backward) {
      softmax_backward_kernel<T, V, W, Log><<<grid, threads, 0, stream>>>(
          static_cast<const T*>(a), static_cast<const T*>(b), static_cast<T*>(out), rows, n);
    } else {
      softmax_kernel<T, V, W, Log>
          <<<grid, threads, 0, stream>>>(static_cast<const T*>(a), static_cast<T*>(out), rows, n);
    }
  };
  using One = std::integral_constant<int, 1>;
  using Wide = std::integral_constant<int, kV>;
  if (vec && warp_row) go(Wide{}, std::true_type{});
  if (vec && !warp_row) go(Wide{}, std::false_type{});
  if (!vec && warp_row) go(One{}, std::true_type{});
  if (!vec && !warp_row) go(One{}, std::false_type{});
  DPT_CUDA_CHECK_LAUNCH();
}

}  // namespace

void softmax(const Tensor& in, const Tensor& out, int64_t rows, int64_t n, bool log) {
  DPT_CHECK(in.is_contiguous() && out.is_contiguous() && in.numel() == rows * n && out.numel() == rows * n &&
                in.dtype() == out.dtype(),
            "softmax kernel (CUDA): {} -> {} is not [{}, {}]", shape_str(in.shape()), shape_str(out.shape()), rows, n);
  const int device = device_of(out, {&in}, "softmax kernel");
  if (rows == 0 || n == 0) return;
  cuda::DeviceGuard guard(device);
  visit_floating(out.dtype(), "softmax", [&](auto tag) {
    using T = decltype(tag);
    if (log) {
      launch_rows<T, true, false>(in.data_ptr(), nullptr, out.data_ptr(), rows, n, device);
    } else {
      launch_rows<T, false, false>(in.data_ptr(), nullptr, out.data_ptr(), rows, n, device);
    }
  });
}

void softmax_backward(const Tensor& grad_out, const Tensor& out, const Tensor& grad_in, int64_t rows, int64_t n,
                      bool log) {
  DPT_CHECK(grad_out.is_contiguous() && out.is_contiguous() && grad_in.is_contiguous() &&
                grad_out.numel() == rows * n && out.numel() == rows * n && grad_in.numel() == rows * n &&
                grad_out.dtype() == grad_in.dtype() && out.dtype() == grad_in.dtype(),
            "softmax_backward kernel (CUDA): operands do not view as [{}, {}] of one dtype", rows, n);
  const int device = device_of(grad_in, {&grad_out, &out}, "softmax_backward kernel");
  if (rows == 0 || n == 0) return;
  cuda::DeviceGuard guard(device);
  visit_floating(grad_in.dtype(), "softmax_backward", [&](auto tag) {
    using T = decltype(tag);
    if (log) {
      launch_rows<T, true, true>(grad_out.data_ptr(), out.data_ptr(), grad_in.data_ptr(), rows, n, device);
    } else {
      launch_rows<T, false, true>(grad_out.data_ptr(), out.data_ptr(), grad_in.data_ptr(), rows, n, device);
    }
  });
}

}  // namespace dpt::cuda_kernels
