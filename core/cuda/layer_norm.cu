// Fused LayerNorm (see core/ops_norm.h for the math).
//
// Forward: one block per row; the block sums x, then the squared deviations (the second pass re-reads
// the row, which a block just touched, from L1/L2), and writes y once. Statistics in float (double for
// float64 input), so bf16 rows are normalised with float32 accuracy.
//
// Backward: block b owns rows [b * kRowsPerChunk, ...). For each row it forms the two row means that
// gx needs, writes gx, and adds gy * xhat and gy into its own partial row of gw/gb (thread t owns
// columns t, t + blockDim, ..., so no two threads touch one value). A second kernel sums the partial
// rows column by column in chunk order. No atomics: the result is the same bits every run.
#include "core/cuda/kernel_utils.cuh"
#include "core/norm_kernels.h"

namespace dpt::cuda_kernels {

namespace {

constexpr int kRowsPerChunk = 32;

// Statistics dtype of the op (core/ops_norm.cpp): float64 rows keep float64 statistics, others float32.
template <class T>
using Stats = std::conditional_t<std::is_same_v<T, double>, double, float>;

template <class T, class W, class S>
__global__ void layer_norm_forward_kernel(const T* __restrict__ x, const W* __restrict__ w, const W* __restrict__ b,
                                          T* __restrict__ y, S* __restrict__ mean, S* __restrict__ rstd, int64_t n,
                                          double eps) {
  using C = S;  // float, or double for float64
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
                                           S* __restrict__ partial_gw, S* __restrict__ partial_gb, int64_t rows,
                                           int64_t n) {
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
      gxr[i] = convert<T>(rs * (dy * convert<C>(w[i]) - mean_g - xhat * mean_gx));
      pgw[i] += dy * xhat;
      pgb[i] += dy;
    }
  }
}

template <class W, class S>
__global__ void column_sum_kernel(const S* __restrict__ partial_gw, const S* __restrict__ partial_gb, int64_t chunks,
                                  int64_t n, W* __restrict__ gw, W* __restrict__ gb) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    S sw = 0, sb = 0;
    for (int64_t c = 0; c < chunks; ++c) {
      sw += partial_gw[c * n + i];
      sb += partial_gb[c * n + i];
    }
    gw[i] = convert<W>(sw);
    gb[i] = convert<W>(sb);
  }
}

}  // namespace

void layer_norm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& y, const Tensor& mean,
                        const Tensor& rstd, int64_t rows, int64_t n, double eps) {
  if (rows == 0) return;
  cudaStream_t stream = cuda::current_stream(x.device().index);
  int threads = row_threads(n);
  visit_floating(x.dtype(), "layer_norm", [&](auto xt) {
    using T = decltype(xt);
    using S = Stats<T>;
    visit_floating(weight.dtype(), "layer_norm weight", [&](auto wt) {
      using W = decltype(wt);
      layer_norm_forward_kernel<T, W, S><<<static_cast<unsigned>(rows), threads, 0, stream>>>(
          x.data<T>(), weight.data<W>(), bias.data<W>(), y.data<T>(), mean.data<S>(), rstd.data<S>(), n, eps);
      DPT_CUDA_CHECK_LAUNCH();
    });
  });
}

void layer_norm_backward(const Tensor& grad_y, const Tensor& x, const Tensor& weight, const Tensor& mean,
                         const Tensor& rstd, const Tensor& grad_x, const Tensor& grad_weight, const Tensor& grad_bias,
                         int64_t rows, int64_t n) {
  int device = x.device().index;
  cudaStream_t stream = cuda::current_stream(device);
  int64_t chunks = (rows + kRowsPerChunk - 1) / kRowsPerChunk;
  if (chunks == 0) chunks = 1;
  visit_floating(x.dtype(), "layer_norm backward", [&](auto xt) {
    using T = decltype(xt);
    using S = Stats<T>;
    visit_floating(weight.dtype(), "layer_norm backward weight", [&](auto wt) {
      using W = decltype(wt);
      DeviceBuffer partial(static_cast<size_t>(2 * chunks * n) * sizeof(S), device);
      S* pgw = partial.as<S>();
      S* pgb = pgw + chunks * n;
      if (rows > 0) {
        layer_norm_backward_kernel<T, W, S><<<static_cast<unsigned>(chunks), row_threads(n), 0, stream>>>(
            grad_y.data<T>(), x.data<T>(), weight.data<W>(), mean.data<S>(), rstd.data<S>(), grad_x.data<T>(), pgw, pgb,
            rows, n);
        DPT_CUDA_CHECK_LAUNCH();
      } else {
        DPT_CUDA_CHECK(cudaMemsetAsync(pgw, 0, static_cast<size_t>(2 * chunks * n) * sizeof(S), stream));
      }
      column_sum_kernel<W, S><<<grid_for(n, device), kThreads, 0, stream>>>(pgw, pgb, rows > 0 ? chunks : 1, n,
                                                                            grad_weight.data<W>(), grad_bias.data<W>());
      DPT_CUDA_CHECK_LAUNCH();
    });
  });
}

}  // namespace dpt::cuda_kernels
