// Fused cross-entropy over [rows, classes] logits. Forward: one pass over each row gives the online
// (max, sum exp) pair, hence logsumexp, and loss = logsumexp - logit[target]; only those two per-row
// statistics are written (float32 for float32/bfloat16 logits, as on the CPU; no probabilities are
// kept). Backward rebuilds softmax = exp(logit - logsumexp) from the saved statistic and writes
// scale * (softmax - onehot(target)) in one pass; `scale` (= gy / count) stays on the device, so the
// whole loss needs no host synchronisation. Rows of up to 1024 classes get one warp, longer rows (a
// vocabulary) one block; rows are read with 16-byte vectors between a scalar head and tail, since a
// row of an odd vocabulary size starts anywhere. cross_entropy_with_grad does both passes in one kernel.
// The exponentials run on the SFU (ce_exp): at GPT-2's vocabulary these kernels are bound by
// instruction issue as much as by memory.
#include <algorithm>
#include <tuple>

#include "core/cuda/cuda_kernels.h"
#include "core/cuda/row_reduce.cuh"

namespace dpt::cuda_kernels {

namespace {

template <class T>
using Stat = std::conditional_t<std::is_same_v<T, double>, double, float>;

// e^x for the float statistics as 2^(x log2 e) on the special-function unit: one FMUL and one MUFU.EX2
// (about 2 ulp) where expf's range reduction costs several more instructions, on the 823M elements per
// pass of GPT-2's logits, where instruction issue rather than memory bounds these kernels. float64 logits
// keep exp (gradient checks).
template <class C>
__device__ __forceinline__ C ce_exp(C x) {
  if constexpr (std::is_same_v<C, float>) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x * 1.4426950408889634f));
    return y;
  } else {
    return exp(x);
  }
}

// online_add (core/cuda/row_reduce.cuh) with ce_exp.
template <class C>
__device__ __forceinline__ void ce_online_add(C& m, C& s, C x) {
  if (x > m) {
    s = s * ce_exp(m - x) + C(1);  // e^-inf = 0 handles the first element
    m = x;
  } else {
    s += ce_exp(x - m);
  }
}

// logsumexp of the row, known to every thread of it (a warp, or the whole block when !WarpRow).
template <bool WarpRow, int V, class T, class C>
__device__ __forceinline__ C row_logsumexp(const T* x, int64_t classes, int tid, int nthreads, C* scratch_m,
                                           C* scratch_s) {
  C m = neg_inf<C>(), s = 0;
  row_visit<V>(x, classes, tid, nthreads, [&](int64_t, T v) { ce_online_add(m, s, convert<C>(v)); });
  row_online<WarpRow>(m, s, scratch_m, scratch_s);
  return m + fast_log(s);
}

// gx = scale (softmax(x) - onehot(t)) over a block's row: scale e^(x - lse) everywhere, then, after a
// barrier, thread 0 rewrites the target's element from `target_logit`, the logit it read before anyone
// could overwrite it (gx may be x). No per-element index test in the loop. An out-of-range target
// leaves the row without the onehot term (its loss is NaN already).
template <int V, bool Reverse, class T, class C>
__device__ __forceinline__ void row_softmax_grad(const T* x, T* gx, int64_t classes, int64_t t, C target_logit,
                                                 C lse, C scale) {
  row_map<V, Reverse>(x, gx, classes, threadIdx.x, blockDim.x,
                      [&](int64_t, T v) { return convert<T>(scale * ce_exp(convert<C>(v) - lse)); });
  __syncthreads();
  if (threadIdx.x == 0 && t >= 0 && t < classes) gx[t] = convert<T>(scale * (ce_exp(target_logit - lse) - C(1)));
}

template <class T>
__device__ __forceinline__ void row_zero(T* gx, int64_t classes) {
  for (int64_t j = threadIdx.x; j < classes; j += blockDim.x) gx[j] = convert<T>(0.0f);
}

template <class T, class S, class I, int V, bool WarpRow>
__global__ void __launch_bounds__(1024)
    cross_entropy_kernel(const T* __restrict__ logits, const I* __restrict__ targets, int64_t rows, int64_t classes,
                         int64_t ignore_index, S* __restrict__ losses, S* __restrict__ logsumexp) {
  using C = Stat<T>;
  __shared__ C scratch_m[32], scratch_s[32];
  const RowSlot<WarpRow> slot;
  if (slot.row >= rows) return;
  const T* x = logits + slot.row * classes;
  const C lse = row_logsumexp<WarpRow, V>(x, classes, slot.tid, slot.nthreads, scratch_m, scratch_s);
  if (slot.tid != 0) return;
  const int64_t t = static_cast<int64_t>(targets[slot.row]);
  C loss = 0;
  if (t != ignore_index) {
    // A kernel cannot throw: an out-of-range target gives a NaN loss instead of a wild read.
    loss = (t >= 0 && t < classes) ? lse - convert<C>(x[t]) : static_cast<C>(NAN);
  }
  logsumexp[slot.row] = convert<S>(lse);
  losses[slot.row] = convert<S>(loss);
}

template <class T, class S, class I, int V>
__global__ void __launch_bounds__(512)
    cross_entropy_backward_kernel(const T* logits, const I* __restrict__ targets, int64_t classes,
                                  int64_t ignore_index, const S* __restrict__ logsumexp,
                                  const S* __restrict__ grad_scale, T* grad_logits) {  // may be `logits`
  using C = Stat<T>;
  const int64_t row = blockIdx.x;
  const T* x = logits + row * classes;
  T* gx = grad_logits + row * classes;
  const int64_t t = static_cast<int64_t>(targets[row]);
  if (t == ignore_index) return row_zero(gx, classes);
  const C target_logit = threadIdx.x == 0 && t >= 0 && t < classes ? convert<C>(x[t]) : C(0);
  row_softmax_grad<V, false>(x, gx, classes, t, target_logit, convert<C>(logsumexp[row]),
                             convert<C>(grad_scale[0]));
}

// cross_entropy_kernel and cross_entropy_backward_kernel over one row in one block: the forward's read of
// the row comes from device memory, the backward's re-read (walking the row from its end, see row_map)
// mostly from L2, so the logits cross the memory bus twice (read, write) instead of three times. The
// block visits the row with the forward kernel's threads (a warp for up to 1024 classes, else 512), so
// the row statistics, and with them the loss and every gradient element, are bitwise those of the two
// separate kernels. The target's logit is read before the barrier in row_online, ahead of any overwrite
// when grad_logits is logits.
template <class T, class S, class I, int V>
__global__ void __launch_bounds__(512)
    cross_entropy_with_grad_kernel(const T* logits, const I* __restrict__ targets, int64_t classes,
                                   int64_t ignore_index, const S* __restrict__ grad_scale, S* __restrict__ losses,
                                   S* __restrict__ logsumexp, T* grad_logits) {  // may be `logits`
  using C = Stat<T>;
  __shared__ C scratch_m[32], scratch_s[32];
  const int64_t row = blockIdx.x;
  const T* x = logits + row * classes;
  T* gx = grad_logits + row * classes;
  const int64_t t = static_cast<int64_t>(targets[row]);
  const bool counted = t != ignore_index, in_range = t >= 0 && t < classes;
  const C target_logit = in_range && threadIdx.x == 0 ? convert<C>(x[t]) : C(0);
  const C lse = row_logsumexp<false, V>(x, classes, threadIdx.x, blockDim.x, scratch_m, scratch_s);
  if (threadIdx.x == 0) {
    // A kernel cannot throw: an out-of-range target gives a NaN loss instead of a wild read.
    logsumexp[row] = convert<S>(lse);
    losses[row] = convert<S>(!counted ? C(0) : in_range ? lse - target_logit : static_cast<C>(NAN));
  }
  if (!counted) return row_zero(gx, classes);
  row_softmax_grad<V, true>(x, gx, classes, t, target_logit, lse, convert<C>(grad_scale[0]));
}

// x *= scale unless scale == 1; every block reads the scale and leaves at once when it is 1.
template <class T, class S>
__global__ void scale_unless_one_kernel(T* x, int64_t n, const S* __restrict__ scale) {
  using C = Stat<T>;
  const C c = convert<C>(scale[0]);
  if (c == C(1)) return;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    x[i] = convert<T>(convert<C>(x[i]) * c);
}

}  // namespace

void cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index, const Tensor& losses,
                   const Tensor& logsumexp) {
  DPT_CHECK(logits.dim() == 2 && logits.is_contiguous() && targets.is_contiguous() && losses.is_contiguous() &&
                logsumexp.is_contiguous() && targets.numel() == logits.size(0) && losses.numel() == logits.size(0) &&
                logsumexp.numel() == logits.size(0) && losses.dtype() == logsumexp.dtype(),
            "cross_entropy kernel (CUDA): logits {}, targets {}, losses {}", shape_str(logits.shape()),
            shape_str(targets.shape()), shape_str(losses.shape()));
  const int device = device_of(losses, {&logits, &targets, &logsumexp}, "cross_entropy kernel");
  const int64_t rows = logits.size(0), classes = logits.size(1);
  if (rows == 0) return;
  DPT_CHECK(classes > 0, "cross_entropy kernel (CUDA): logits {} have no classes", shape_str(logits.shape()));
  cuda::DeviceGuard guard(device);
  cudaStream_t stream = cuda::current_stream(device);
  visit_floating(logits.dtype(), "cross_entropy", [&](auto tag) {
    using T = decltype(tag);
    visit_floating(losses.dtype(), "cross_entropy losses", [&](auto stat_tag) {
      using S = decltype(stat_tag);
      visit_index(targets.dtype(), "cross_entropy targets", [&](auto itag) {
        using I = decltype(itag);
        const T* x = ptr<const T>(logits);
        const I* tg = ptr<const I>(targets);
        if (classes <= kWarpRowMax) {
          const auto grid = static_cast<unsigned>((rows + kWarpRowsPerBlock - 1) / kWarpRowsPerBlock);
          cross_entropy_kernel<T, S, I, vec_width<T>(), true><<<grid, 32 * kWarpRowsPerBlock, 0, stream>>>(
              x, tg, rows, classes, ignore_index, ptr<S>(losses), ptr<S>(logsumexp));
        } else {
          // A vocabulary row (50257 bf16) is ~6300 vectors: 512 threads keep about a dozen each in flight.
          cross_entropy_kernel<T, S, I, vec_width<T>(), false><<<static_cast<unsigned>(rows), 512, 0, stream>>>(
              x, tg, rows, classes, ignore_index, ptr<S>(losses), ptr<S>(logsumexp));
        }
        DPT_CUDA_CHECK_LAUNCH();
      });
    });
  });
}

void cross_entropy_backward(const Tensor& logits, const Tensor& targets, int64_t ignore_index, const Tensor& logsumexp,
                            const Tensor& grad_scale, const Tensor& grad_logits) {
  DPT_CHECK(logits.dim() == 2 && logits.is_contiguous() && grad_logits.is_contiguous() && targets.is_contiguous() &&
                logsumexp.is_contiguous() && grad_logits.shape() == logits.shape() &&
                grad_logits.dtype() == logits.dtype() && targets.numel() == logits.size(0) &&
                logsumexp.numel() == logits.size(0) && grad_scale.numel() == 1 &&
                grad_scale.dtype() == logsumexp.dtype(),
            "cross_entropy_backward kernel (CUDA): logits {}, grad_logits {}, grad_scale {}", shape_str(logits.shape()),
            shape_str(grad_logits.shape()), shape_str(grad_scale.shape()));
  const int device = device_of(grad_logits, {&logits, &targets, &logsumexp, &grad_scale}, "cross_entropy_backward");
  const int64_t rows = logits.size(0), classes = logits.size(1);
  if (rows == 0 || classes == 0) return;
  cuda::DeviceGuard guard(device);
  cudaStream_t stream = cuda::current_stream(device);
  visit_floating(logits.dtype(), "cross_entropy_backward", [&](auto tag) {
    using T = decltype(tag);
    visit_floating(logsumexp.dtype(), "cross_entropy_backward stats", [&](auto stat_tag) {
      using S = decltype(stat_tag);
      visit_index(targets.dtype(), "cross_entropy_backward targets", [&](auto itag) {
        using I = decltype(itag);
        const int threads = std::min(row_threads(classes), 512);
        const auto grid = static_cast<unsigned>(rows);
        auto args = std::make_tuple(ptr<const T>(logits), ptr<const I>(targets), classes, ignore_index,
                                    ptr<const S>(logsumexp), ptr<const S>(grad_scale), ptr<T>(grad_logits));
        // Vector loads and stores need logits and gradient rows at the same offset from 16 bytes.
        if (same_alignment({logits.data_ptr(), grad_logits.data_ptr()})) {
          std::apply(
              [&](auto... a) {
                cross_entropy_backward_kernel<T, S, I, vec_width<T>()><<<grid, threads, 0, stream>>>(a...);
              },
              args);
        } else {
          std::apply([&](auto... a) { cross_entropy_backward_kernel<T, S, I, 1><<<grid, threads, 0, stream>>>(a...); },
                     args);
        }
        DPT_CUDA_CHECK_LAUNCH();
      });
    });
  });
}

void cross_entropy_with_grad(const Tensor& logits, const Tensor& targets, int64_t ignore_index,
                             const Tensor& grad_scale, const Tensor& losses, const Tensor& logsumexp,
                             const Tensor& grad_logits) {
  DPT_CHECK(logits.dim() == 2 && logits.is_contiguous() && grad_logits.is_contiguous() && targets.is_contiguous() &&
                losses.is_contiguous() && logsumexp.is_contiguous() && grad_logits.shape() == logits.shape() &&
                grad_logits.dtype() == logits.dtype() && targets.numel() == logits.size(0) &&
                losses.numel() == logits.size(0) && logsumexp.numel() == logits.size(0) &&
                losses.dtype() == logsumexp.dtype() && grad_scale.numel() == 1 &&
                grad_scale.dtype() == logsumexp.dtype(),
            "cross_entropy_with_grad kernel (CUDA): logits {}, targets {}, grad_logits {}, grad_scale {}",
            shape_str(logits.shape()), shape_str(targets.shape()), shape_str(grad_logits.shape()),
            shape_str(grad_scale.shape()));
  const int device =
      device_of(grad_logits, {&logits, &targets, &losses, &logsumexp, &grad_scale}, "cross_entropy_with_grad");
  const int64_t rows = logits.size(0), classes = logits.size(1);
  if (rows == 0) return;
  DPT_CHECK(classes > 0, "cross_entropy_with_grad kernel (CUDA): logits {} have no classes", shape_str(logits.shape()));
  cuda::DeviceGuard guard(device);
  cudaStream_t stream = cuda::current_stream(device);
  visit_floating(logits.dtype(), "cross_entropy_with_grad", [&](auto tag) {
    using T = decltype(tag);
    visit_floating(losses.dtype(), "cross_entropy_with_grad stats", [&](auto stat_tag) {
      using S = decltype(stat_tag);
      visit_index(targets.dtype(), "cross_entropy_with_grad targets", [&](auto itag) {
        using I = decltype(itag);
        const int threads = classes <= kWarpRowMax ? 32 : 512;
        const auto grid = static_cast<unsigned>(rows);
        auto args = std::make_tuple(ptr<const T>(logits), ptr<const I>(targets), classes, ignore_index,
                                    ptr<const S>(grad_scale), ptr<S>(losses), ptr<S>(logsumexp), ptr<T>(grad_logits));
        if (same_alignment({logits.data_ptr(), grad_logits.data_ptr()})) {
          std::apply(
              [&](auto... a) {
                cross_entropy_with_grad_kernel<T, S, I, vec_width<T>()><<<grid, threads, 0, stream>>>(a...);
              },
              args);
        } else {
          std::apply([&](auto... a) { cross_entropy_with_grad_kernel<T, S, I, 1><<<grid, threads, 0, stream>>>(a...); },
                     args);
        }
        DPT_CUDA_CHECK_LAUNCH();
      });
    });
  });
}

void scale_unless_one(const Tensor& x, const Tensor& scale) {
  DPT_CHECK(x.is_contiguous() && scale.numel() == 1, "scale_unless_one kernel (CUDA): x {}, scale {}",
            shape_str(x.shape()), shape_str(scale.shape()));
  const int device = device_of(x, {&scale}, "scale_unless_one");
  const int64_t n = x.numel();
  if (n == 0) return;
  cuda::DeviceGuard guard(device);
  cudaStream_t stream = cuda::current_stream(device);
  // A grid-stride loop over a few blocks per SM: when the scale is 1 the whole launch is a few hundred
  // blocks that each read one value and leave.
  const auto grid = static_cast<unsigned>(std::min<int64_t>((n + 255) / 256, 1024));
  visit_floating(x.dtype(), "scale_unless_one", [&](auto tag) {
    using T = decltype(tag);
    visit_floating(scale.dtype(), "scale_unless_one scale", [&](auto stat_tag) {
      using S = decltype(stat_tag);
      scale_unless_one_kernel<T, S><<<grid, 256, 0, stream>>>(ptr<T>(x), n, ptr<const S>(scale));
      DPT_CUDA_CHECK_LAUNCH();
    });
  });
}

}  // namespace dpt::cuda_kernels
