// Embedding lookup and its deterministic backward; rows of any tensor gathered by index.
//
// Backward without float atomics: grad_weight[row] += sum of grad_out[i] over positions i with
// indices[i] == row, always added in increasing i — the CPU's order, so float32 results match it bit
// for bit. To get there in parallel:
//   1. keys[i] = indices[i] (out-of-range indices map to `num`, past every real row), pos[i] = i;
//   2. stable radix sort of (key, pos) by key (cub): equal keys keep increasing positions;
//   3. one block per sorted slot that starts a run of equal keys; its threads split the embedding
//      dim, and each thread walks the run in order, accumulating in float32 (float64 for float64)
//      starting from the existing grad_weight value, then stores once.
// Every grad_weight element is written by exactly one thread, so there is no race and no atomics. A
// token repeated many times makes one long run (one busy block); that is the price of determinism.
#include <algorithm>
#include <cub/device/device_radix_sort.cuh>

#include "core/cuda/cuda_kernels.h"
#include "core/cuda/kernel_utils.cuh"

namespace dpt::cuda_kernels {

namespace {

template <class T>
__device__ __forceinline__ T quiet_nan() {
  return convert<T>(__int_as_float(0x7fc00000));
}

// One block per looked-up row; out-of-range indices give a row of NaN (a kernel cannot throw; NaN
// makes the bad lookup visible in the loss instead of reading out of bounds).
template <class T, class I, int V>
__global__ void embedding_kernel(const T* __restrict__ weight, const I* __restrict__ indices, T* __restrict__ out,
                                 int64_t num, int64_t dim) {
  const int64_t i = blockIdx.x;
  const int64_t row = static_cast<int64_t>(indices[i]);
  const int64_t nv = dim / V;
  auto* dst = reinterpret_cast<Vec<T, V>*>(out + i * dim);
  if (row < 0 || row >= num) {
    Vec<T, V> bad;
#pragma unroll
    for (int k = 0; k < V; ++k) bad.v[k] = quiet_nan<T>();
    for (int64_t j = threadIdx.x; j < nv; j += blockDim.x) dst[j] = bad;
    return;
  }
  const auto* src = reinterpret_cast<const Vec<T, V>*>(weight + row * dim);
  for (int64_t j = threadIdx.x; j < nv; j += blockDim.x) dst[j] = src[j];
}

// Word w of out (W-byte words, per_row to a row) is word w % per_row of row indices[w / per_row] of src, or
// zero bytes for an index outside [0, num).
template <class W, class I>
__global__ void gather_rows_kernel(const W* __restrict__ src, const I* __restrict__ indices, W* __restrict__ out,
                                   int64_t num, int64_t per_row, int64_t total) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t w = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; w < total; w += stride) {
    const int64_t i = w / per_row;
    const int64_t row = static_cast<int64_t>(indices[i]);
    out[w] = row >= 0 && row < num ? src[row * per_row + (w - i * per_row)] : W{};
  }
}

template <class I>
__global__ void make_keys_kernel(const I* __restrict__ indices, int64_t count, int64_t num, uint32_t* __restrict__ keys,
                                 int32_t* __restrict__ positions) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride) {
    const int64_t row = static_cast<int64_t>(indices[i]);
    keys[i] = static_cast<uint32_t>(row >= 0 && row < num ? row : num);
    positions[i] = static_cast<int32_t>(i);
  }
}

// One block per run of equal keys in the sorted order (a vocabulary row and every position that looks it
// up). A small vocabulary has long runs (a character model's 65 rows share 16k positions), so the block
// spreads a run over kRunLanes lanes: lane y adds positions y, y + kRunLanes, ... of the run, then lane 0 adds
// the lanes in order. The grouping depends only on the run, never on timing: deterministic.
constexpr int kRunLanes = kernels::kEmbeddingLanes;
constexpr int kRunColumns = 32;
constexpr int kRunChunks = 8;  // columns a pass: kRunChunks x kRunColumns, each lane keeping one sum per chunk

template <class T>
__global__ void __launch_bounds__(kRunColumns* kRunLanes)
    embedding_backward_kernel(const T* __restrict__ grad_out, const uint32_t* __restrict__ keys,
                              const int32_t* __restrict__ positions, int64_t count, int64_t num, int64_t dim,
                              T* __restrict__ grad_weight) {
  using C = Compute<T>;
  __shared__ C partial[kRunLanes][kRunChunks * kRunColumns];
  const int64_t start = blockIdx.x;
  const uint32_t key = keys[start];
  if ((start > 0 && keys[start - 1] == key) || key >= num) return;  // not a run start, or invalid indices
  // The run's end: keys are sorted, so the positions that still match form a prefix of each window.
  const int tid = threadIdx.y * kRunColumns + threadIdx.x;
  int64_t end = start;
  for (;;) {
    const int64_t j = end + tid;
    const int same = __syncthreads_count(j < count && keys[j] == key);
    end += same;
    if (same < kRunColumns * kRunLanes) break;
  }
  T* gw = grad_weight + static_cast<int64_t>(key) * dim;
  for (int64_t d0 = 0; d0 < dim; d0 += kRunChunks * kRunColumns) {
    C acc[kRunChunks];
#pragma unroll
    for (int k = 0; k < kRunChunks; ++k) acc[k] = 0;
    for (int64_t j = start + threadIdx.y; j < end; j += kRunLanes) {
      const T* row = grad_out + static_cast<int64_t>(positions[j]) * dim + d0 + threadIdx.x;
#pragma unroll
      for (int k = 0; k < kRunChunks; ++k) {
        if (d0 + k * kRunColumns + threadIdx.x < dim) acc[k] += convert<C>(row[k * kRunColumns]);
      }
    }
#pragma unroll
    for (int k = 0; k < kRunChunks; ++k) partial[threadIdx.y][k * kRunColumns + threadIdx.x] = acc[k];
    __syncthreads();
    for (int c = tid; c < kRunChunks * kRunColumns; c += kRunColumns * kRunLanes) {
      if (d0 + c < dim) {
        C sum = convert<C>(gw[d0 + c]);
#pragma unroll
        for (int y = 0; y < kRunLanes; ++y) sum += partial[y][c];
        gw[d0 + c] = convert<T>(sum);
      }
    }
    __syncthreads();
  }
}

int bits_for(uint64_t max_value) {
  int bits = 1;
  while (bits < 32 && (uint64_t{1} << bits) <= max_value) ++bits;
  return bits;
}

}  // namespace

void embedding(const Tensor& weight, const Tensor& indices, const Tensor& out) {
  DPT_CHECK(weight.dim() == 2 && weight.is_contiguous() && indices.is_contiguous() && out.is_contiguous() &&
                out.numel() == indices.numel() * weight.size(1) && out.dtype() == weight.dtype(),
            "embedding kernel (CUDA): weight {} and indices {} do not fill output {}", shape_str(weight.shape()),
            shape_str(indices.shape()), shape_str(out.shape()));
  const int device = device_of(out, {&weight, &indices}, "embedding kernel");
  const int64_t num = weight.size(0), dim = weight.size(1), count = indices.numel();
  if (count == 0 || dim == 0) return;
  DPT_CHECK(count < (int64_t{1} << 31), "embedding kernel (CUDA): {} lookups exceed the grid limit", count);
  cuda::DeviceGuard guard(device);
  cudaStream_t stream = cuda::current_stream(device);
  visit_floating(weight.dtype(), "embedding", [&](auto tag) {
    using T = decltype(tag);
    visit_index(indices.dtype(), "embedding", [&](auto itag) {
      using I = decltype(itag);
      constexpr int kV = vec_width<T>();
      const bool vec = dim % kV == 0 && aligned16(weight.data_ptr()) && aligned16(out.data_ptr());
      const int threads = std::min(row_threads(dim, vec ? kV : 1), 256);
      const auto grid = static_cast<unsigned>(count);
      if (vec) {
        embedding_kernel<T, I, kV>
            <<<grid, threads, 0, stream>>>(ptr<const T>(weight), ptr<const I>(indices), ptr<T>(out), num, dim);
      } else {
        embedding_kernel<T, I, 1>
            <<<grid, threads, 0, stream>>>(ptr<const T>(weight), ptr<const I>(indices), ptr<T>(out), num, dim);
      }
      DPT_CUDA_CHECK_LAUNCH();
    });
  });
}

void gather_rows(const Tensor& src, const Tensor& indices, const Tensor& out) {
  DPT_CHECK(src.dim() >= 1 && src.is_contiguous() && indices.is_contiguous() && out.is_contiguous() &&
                out.dim() == src.dim() && out.size(0) == indices.numel() && out.dtype() == src.dtype() &&
                std::equal(src.shape().begin() + 1, src.shape().end(), out.shape().begin() + 1),
            "gather_rows kernel (CUDA): rows {} of {} do not fill output {}", shape_str(indices.shape()),
            shape_str(src.shape()), shape_str(out.shape()));
  const int device = device_of(out, {&src, &indices}, "gather_rows kernel");
  const int64_t num = src.size(0), count = indices.numel();
  const size_t row_bytes = num == 0 ? 0 : src.nbytes() / static_cast<size_t>(num);
  if (count == 0 || row_bytes == 0) return;
  cuda::DeviceGuard guard(device);
  cudaStream_t stream = cuda::current_stream(device);
  const auto aligned = [&](size_t bytes) {
    const auto a = reinterpret_cast<uintptr_t>(src.data_ptr()), b = reinterpret_cast<uintptr_t>(out.data_ptr());
    return row_bytes % bytes == 0 && a % bytes == 0 && b % bytes == 0;
  };
  visit_index(indices.dtype(), "gather_rows", [&](auto itag) {
    using I = decltype(itag);
    const auto launch = [&](auto word) {
      using W = decltype(word);
      const auto per_row = static_cast<int64_t>(row_bytes / sizeof(W));
      const int64_t total = per_row * count;
      gather_rows_kernel<W, I><<<grid_for(total, device), kThreads, 0, stream>>>(
          static_cast<const W*>(src.data_ptr()), ptr<const I>(indices), static_cast<W*>(out.data_ptr()), num, per_row,
          total);
      DPT_CUDA_CHECK_LAUNCH();
    };
    if (aligned(16)) {
      launch(uint4{});
    } else if (aligned(4)) {
      launch(uint32_t{});
    } else {
      launch(uint8_t{});
    }
  });
}

void embedding_backward(const Tensor& grad_out, const Tensor& indices, const Tensor& grad_weight) {
  DPT_CHECK(grad_weight.dim() == 2 && grad_weight.is_contiguous() && grad_out.is_contiguous() &&
                indices.is_contiguous() && grad_out.numel() == indices.numel() * grad_weight.size(1) &&
                grad_out.dtype() == grad_weight.dtype(),
            "embedding_backward kernel (CUDA): grad {} and indices {} do not fit grad_weight {}",
            shape_str(grad_out.shape()), shape_str(indices.shape()), shape_str(grad_weight.shape()));
  const int device = device_of(grad_weight, {&grad_out, &indices}, "embedding_backward kernel");
  const int64_t num = grad_weight.size(0), dim = grad_weight.size(1), count = indices.numel();
  if (count == 0 || dim == 0) return;
  DPT_CHECK(count < (int64_t{1} << 31) && num < (int64_t{1} << 32) - 1,
            "embedding_backward kernel (CUDA): {} lookups into {} rows exceed the 32-bit sort keys", count, num);
  cuda::DeviceGuard guard(device);
  cudaStream_t stream = cuda::current_stream(device);
  const int n = static_cast<int>(count);

  // 1. keys and positions.
  DeviceBuffer keys_in(sizeof(uint32_t) * count, device), keys_out(sizeof(uint32_t) * count, device);
  DeviceBuffer pos_in(sizeof(int32_t) * count, device), pos_out(sizeof(int32_t) * count, device);
  visit_index(indices.dtype(), "embedding_backward", [&](auto itag) {
    using I = decltype(itag);
    make_keys_kernel<I><<<grid_for(count, device), kThreads, 0, stream>>>(ptr<const I>(indices), count, num,
                                                                          keys_in.as<uint32_t>(), pos_in.as<int32_t>());
    DPT_CUDA_CHECK_LAUNCH();
  });

  // 2. stable sort by key over just the bits that keys in [0, num] use.
  const int end_bit = bits_for(static_cast<uint64_t>(num));
  size_t temp_bytes = 0;
  DPT_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, keys_in.as<uint32_t>(), keys_out.as<uint32_t>(),
                                                 pos_in.as<int32_t>(), pos_out.as<int32_t>(), n, 0, end_bit, stream));
  DeviceBuffer temp(std::max<size_t>(temp_bytes, 1), device);
  DPT_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp.as<void>(), temp_bytes, keys_in.as<uint32_t>(),
                                                 keys_out.as<uint32_t>(), pos_in.as<int32_t>(), pos_out.as<int32_t>(),
                                                 n, 0, end_bit, stream));

  // 3. one block per run of equal keys.
  visit_floating(grad_weight.dtype(), "embedding_backward", [&](auto tag) {
    using T = decltype(tag);
    embedding_backward_kernel<T><<<static_cast<unsigned>(count), dim3(kRunColumns, kRunLanes), 0, stream>>>(
        ptr<const T>(grad_out), keys_out.as<uint32_t>(), pos_out.as<int32_t>(), count, num, dim, ptr<T>(grad_weight));
    DPT_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace dpt::cuda_kernels
