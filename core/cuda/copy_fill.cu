// Copies with dtype conversion (from any strided view into a contiguous tensor), fills and ranges.
#include <algorithm>

#include "core/cuda/cuda_kernels.h"
#include "core/cuda/kernel_utils.cuh"
#include "core/cuda/strided.cuh"

namespace dpt::cuda_kernels {

namespace {

template <class S, class D>
__global__ void convert_contiguous_kernel(const S* __restrict__ src, D* __restrict__ dst, int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    dst[i] = convert<D>(src[i]);
  }
}

template <class S, class D, class I>
__global__ void copy_strided_kernel(const S* __restrict__ src, D* __restrict__ dst, I n, StridedShape<1> shape) {
  const I stride = static_cast<I>(gridDim.x) * blockDim.x;
  for (I i = static_cast<I>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    int64_t off[1];
    shape.offsets(i, off);
    dst[i] = convert<D>(src[off[0]]);
  }
}

// The strided copy, V elements per step along a contiguous (or broadcast) innermost source dim.
template <class S, class D, int V, class I>
__global__ void copy_strided_vec_kernel(const S* __restrict__ src, D* __restrict__ dst, I nvec, StridedShape<1> shape,
                                        bool src_vec) {
  const I stride = static_cast<I>(gridDim.x) * blockDim.x;
  for (I iv = static_cast<I>(blockIdx.x) * blockDim.x + threadIdx.x; iv < nvec; iv += stride) {
    int64_t off[1];
    shape.offsets(iv * V, off);
    Vec<S, V> x;
    if (src_vec) {
      x = *reinterpret_cast<const Vec<S, V>*>(src + off[0]);
    } else {
#pragma unroll
      for (int q = 0; q < V; ++q) x.v[q] = src[off[0]];
    }
    Vec<D, V> y;
#pragma unroll
    for (int q = 0; q < V; ++q) y.v[q] = convert<D>(x.v[q]);
    reinterpret_cast<Vec<D, V>*>(dst)[iv] = y;
  }
}

// A strided copy whose source has unit stride on some dim u other than the last (a transpose, concat's
// dim-to-front move): element-at-a-time reads along the destination's last dim L would touch one
// element per sector. Instead each block moves 32 x 32 tiles of the (u, L) plane through shared memory:
// reads walk u (contiguous in the source), writes walk L (contiguous in the destination). The remaining
// dims index a batch of such planes.
constexpr int kTile = 32;
constexpr int kTileRows = 8;  // block = kTile x kTileRows threads; each moves kTile / kTileRows elements

struct TransposePlan {
  int batch_dims = 0;
  int64_t batch = 1;
  int64_t batch_sizes[kMaxDims] = {};
  int64_t batch_src[kMaxDims] = {};  // source strides of the batch dims
  int64_t batch_dst[kMaxDims] = {};  // destination (contiguous) strides of the batch dims
  int64_t size_u = 1, size_l = 1;
  int64_t src_l = 0;  // source stride along L (along u it is 1)
  int64_t dst_u = 0;  // destination stride along u (along L it is 1)
};

template <class S, class D>
__global__ void __launch_bounds__(kTile* kTileRows)
    copy_transpose_kernel(const S* __restrict__ src, D* __restrict__ dst, TransposePlan p) {
  __shared__ D tile[kTile][kTile + 1];  // [l][u]; the +1 keeps the column reads free of bank conflicts
  const int64_t tiles_l = (p.size_l + kTile - 1) / kTile, tiles_u = (p.size_u + kTile - 1) / kTile;
  const int64_t total = tiles_l * tiles_u * p.batch;
  const int tx = threadIdx.x, ty = threadIdx.y;
  for (int64_t t = blockIdx.x; t < total; t += gridDim.x) {
    const int64_t l0 = (t % tiles_l) * kTile;
    const int64_t rest = t / tiles_l;
    const int64_t u0 = (rest % tiles_u) * kTile;
    int64_t b = rest / tiles_u, so = 0, dof = 0;
    for (int d = p.batch_dims - 1; d >= 0; --d) {
      const int64_t i = b % p.batch_sizes[d];
      b /= p.batch_sizes[d];
      so += i * p.batch_src[d];
      dof += i * p.batch_dst[d];
    }
    const int64_t u_read = u0 + tx;
    for (int r = ty; r < kTile; r += kTileRows) {
      const int64_t l = l0 + r;
      if (u_read < p.size_u && l < p.size_l) tile[r][tx] = convert<D>(src[so + u_read + l * p.src_l]);
    }
    __syncthreads();
    const int64_t l_write = l0 + tx;
    for (int r = ty; r < kTile; r += kTileRows) {
      const int64_t u = u0 + r;
      if (u < p.size_u && l_write < p.size_l) dst[dof + u * p.dst_u + l_write] = tile[tx][r];
    }
    __syncthreads();  // the next tile overwrites `tile`
  }
}

// The tiled plan when the source's unit-stride dim is not the last one (and the last is not broadcast).
bool transpose_plan(const StridedShape<1>& s, TransposePlan* plan) {
  const int last = s.ndim - 1;
  if (s.ndim < 2 || s.strides[0][last] == 1 || s.strides[0][last] == 0) return false;
  int u = -1;
  for (int d = 0; d < last; ++d) {
    if (s.strides[0][d] == 1) u = d;
  }
  if (u < 0) return false;
  int64_t dst_stride[kMaxDims];
  int64_t acc = 1;
  for (int d = last; d >= 0; --d) {
    dst_stride[d] = acc;
    acc *= s.sizes[d];
  }
  TransposePlan p;
  p.size_u = s.sizes[u];
  p.size_l = s.sizes[last];
  p.src_l = s.strides[0][last];
  p.dst_u = dst_stride[u];
  for (int d = 0; d < last; ++d) {
    if (d == u) continue;
    p.batch_sizes[p.batch_dims] = s.sizes[d];
    p.batch_src[p.batch_dims] = s.strides[0][d];
    p.batch_dst[p.batch_dims] = dst_stride[d];
    p.batch *= s.sizes[d];
    ++p.batch_dims;
  }
  *plan = p;
  return true;
}

template <class T, int V>
__global__ void fill_kernel(T* __restrict__ out, int64_t n, T value) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t nvec = n / V;
  Vec<T, V> v;
#pragma unroll
  for (int j = 0; j < V; ++j) v.v[j] = value;
  for (int64_t i = first; i < nvec; i += stride) reinterpret_cast<Vec<T, V>*>(out)[i] = v;
  for (int64_t i = nvec * V + first; i < n; i += stride) out[i] = value;
}

template <class T>
__global__ void arange_kernel(T* __restrict__ out, int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    out[i] = convert<T>(i);
  }
}

}  // namespace

void copy_strided(const Tensor& src, const Tensor& dst) {
  DPT_CHECK(src.shape() == dst.shape() && dst.is_contiguous(),
            "copy kernel (CUDA): source {} must match the contiguous destination {}", shape_str(src.shape()),
            shape_str(dst.shape()));
  const int device = device_of(dst, {&src}, "copy kernel");
  const int64_t n = dst.numel();
  if (n == 0) return;
  cuda::DeviceGuard guard(device);
  cudaStream_t stream = cuda::current_stream(device);
  if (src.dtype() == dst.dtype() && src.is_contiguous()) {
    if (src.data_ptr() != dst.data_ptr()) {
      DPT_CUDA_CHECK(cudaMemcpyAsync(dst.data_ptr(), src.data_ptr(), dst.nbytes(), cudaMemcpyDeviceToDevice, stream));
    }
    return;
  }
  visit_all(src.dtype(), [&](auto src_tag) {
    using S = decltype(src_tag);
    visit_all(dst.dtype(), [&](auto dst_tag) {
      using D = decltype(dst_tag);
      const S* ps = ptr<const S>(src);
      D* pd = ptr<D>(dst);
      if (src.is_contiguous()) {
        convert_contiguous_kernel<S, D><<<grid_for(n, device), kThreads, 0, stream>>>(ps, pd, n);
      } else {
        StridedShape<1> shape = make_strided_shape<1>(src.shape(), {&src.strides()}, "copy kernel");
        // Permuted copies that keep the last dim (attention's head split/merge) move 16 bytes at a time.
        constexpr int V = 16 / (sizeof(S) > sizeof(D) ? sizeof(S) : sizeof(D));
        if (reinterpret_cast<uintptr_t>(pd) % (V * sizeof(D)) == 0 &&
            inner_vectorizable<1>(shape, {ps}, V, sizeof(S))) {
          const int64_t nvec = n / V;
          const bool src_vec = shape.strides[0][shape.ndim - 1] == 1;
          if (n < (int64_t{1} << 31)) {  // element indices fit 32 bits
            copy_strided_vec_kernel<S, D, V, uint32_t>
                <<<grid_for(nvec, device), kThreads, 0, stream>>>(ps, pd, static_cast<uint32_t>(nvec), shape, src_vec);
          } else {
            copy_strided_vec_kernel<S, D, V, int64_t>
                <<<grid_for(nvec, device), kThreads, 0, stream>>>(ps, pd, nvec, shape, src_vec);
          }
          DPT_CUDA_CHECK_LAUNCH();
          return;
        }
        TransposePlan plan;
        if (transpose_plan(shape, &plan)) {
          const int64_t tiles = ((plan.size_l + kTile - 1) / kTile) * ((plan.size_u + kTile - 1) / kTile) * plan.batch;
          const auto blocks = static_cast<unsigned>(std::min<int64_t>(tiles, int64_t{sm_count(device)} * 16));
          copy_transpose_kernel<S, D><<<blocks, dim3(kTile, kTileRows), 0, stream>>>(ps, pd, plan);
          DPT_CUDA_CHECK_LAUNCH();
          return;
        }
        if (n < (int64_t{1} << 31)) {
          copy_strided_kernel<S, D, uint32_t>
              <<<grid_for(n, device), kThreads, 0, stream>>>(ps, pd, static_cast<uint32_t>(n), shape);
        } else {
          copy_strided_kernel<S, D, int64_t><<<grid_for(n, device), kThreads, 0, stream>>>(ps, pd, n, shape);
        }
      }
      DPT_CUDA_CHECK_LAUNCH();
    });
  });
}

void fill(const Tensor& out, double value) {
  DPT_CHECK(out.is_contiguous(), "fill kernel (CUDA): expected a contiguous tensor of shape {}",
            shape_str(out.shape()));
  const int device = device_of(out, {}, "fill kernel");
  const int64_t n = out.numel();
  if (n == 0) return;
  cuda::DeviceGuard guard(device);
  cudaStream_t stream = cuda::current_stream(device);
  visit_all(out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T v = convert<T>(value);
    T* p = ptr<T>(out);
    constexpr int V = vec_width<T>();
    if (aligned16(p)) {
      fill_kernel<T, V><<<grid_for((n + V - 1) / V, device), kThreads, 0, stream>>>(p, n, v);
    } else {
      fill_kernel<T, 1><<<grid_for(n, device), kThreads, 0, stream>>>(p, n, v);
    }
    DPT_CUDA_CHECK_LAUNCH();
  });
}

void arange(const Tensor& out) {
  DPT_CHECK(out.is_contiguous(), "arange kernel (CUDA): expected a contiguous tensor");
  const int device = device_of(out, {}, "arange kernel");
  const int64_t n = out.numel();
  if (n == 0) return;
  cuda::DeviceGuard guard(device);
  visit_all(out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    arange_kernel<T><<<grid_for(n, device), kThreads, 0, cuda::current_stream(device)>>>(ptr<T>(out), n);
    DPT_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace dpt::cuda_kernels
