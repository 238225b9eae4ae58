// Row-wise softmax / log-softmax over the last dim, and their backward. Statistics are in float32 for
// bfloat16 and float32 inputs (float64 for float64), as on the CPU. Forward reads each row twice: one
// pass for the online (max, sum exp) pair, one to write; backward reads twice: one dot product
// (sum(gy * y), or sum(gy) for the log form), one to write. Rows of up to 1024 elements get one warp
// each, longer rows one block each; loads are 16-byte vectors between a scalar head and tail.
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
  const T* x = in + slot.row * n;
  T* y = out + slot.row * n;
  C m = neg_inf<C>(), s = 0;
  row_visit<V>(x, n, slot.tid, slot.nthreads, [&](int64_t, T v) { online_add(m, s, convert<C>(v)); });
  row_online<WarpRow>(m, s, scratch_m, scratch_s);
  const C lse = m + fast_log(s);
  const C inv = C(1) / s;
  row_map<V>(x, y, n, slot.tid, slot.nthreads, [&](int64_t, T v) {
    const C c = convert<C>(v);
    return convert<T>(Log ? c - lse : fast_exp(c - m) * inv);
  });
}

template <class T, int V, bool WarpRow, bool Log>
__global__ void __launch_bounds__(1024)
    softmax_backward_kernel(const T* __restrict__ grad_out, const T* __restrict__ out, T* __restrict__ grad_in,
                            int64_t rows, int64_t n) {
  using C = Compute<T>;
  __shared__ C scratch[32];
  const RowSlot<WarpRow> slot;
  if (slot.row >= rows) return;
  const T* gy = grad_out + slot.row * n;
  const T* y = out + slot.row * n;
  T* gx = grad_in + slot.row * n;
  C dot = 0;
  if constexpr (Log) {
    row_visit<V>(gy, n, slot.tid, slot.nthreads, [&](int64_t, T g) { dot += convert<C>(g); });
  } else {
    row_visit2<V>(gy, y, n, slot.tid, slot.nthreads, [&](int64_t, T g, T p) { dot += convert<C>(g) * convert<C>(p); });
  }
  dot = row_sum<WarpRow>(dot, scratch);
  // log form: y = log p, gx = gy - p * sum(gy); plain form: gx = p * (gy - sum(gy * p)).
  row_map2<V>(gy, y, gx, n, slot.tid, slot.nthreads, [&](int64_t, T g, T p) {
    const C gc = convert<C>(g), pc = convert<C>(p);
    return convert<T>(Log ? gc - fast_exp(pc) * dot : pc * (gc - dot));
  });
}

// Picks vector width and row layout, then launches `kernel<T, V, WarpRow, Log>`.
template <class T, bool Log, bool Backward>
void launch_rows(const void* a, const void* b, void* out, int64_t rows, int64_t n, int device) {
  constexpr int kV = vec_width<T>();
  // Vectors need every operand's rows to start at the same offset from a 16-byte boundary; rows of any
  // length then use them between a scalar head and tail.
  const bool vec = same_alignment({a, out, b ? b : a});
  const bool warp_row = n <= kWarpRowMax;
  cudaStream_t stream = cuda::current_stream(device);
  auto go = [&](auto v_tag, auto warp_tag) {
    constexpr int V = decltype(v_tag)::value;
    constexpr bool W = decltype(warp_tag)::value;
    const unsigned grid =
        W ? static_cast<unsigned>((rows + kWarpRowsPerBlock - 1) / kWarpRowsPerBlock) : static_cast<unsigned>(rows);
    // Block rows: at most 256 threads, so each thread has several vectors in flight per pass.
    const int threads = W ? 32 * kWarpRowsPerBlock : std::min(row_threads(n, V), 256);
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
