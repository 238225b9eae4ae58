// Random fills: element i is philox::normal_at / uniform_at(seed, offset, i) — the very functions the
// CPU kernels call (core/philox.h) — so a draw does not depend on the launch configuration or the
// device. The affine map is evaluated in double with explicit round-to-nearest multiply and add (no
// fused multiply-add, which the host does not use either) and rounded once to the dtype.
#include <type_traits>

#include "core/cuda/cuda_kernels.h"
#include "core/cuda/kernel_utils.cuh"
#include "core/philox.h"

namespace dpt::cuda_kernels {

namespace {

template <class T, bool Normal>
__global__ void random_kernel(T* __restrict__ out, int64_t n, uint64_t seed, uint64_t offset, double shift,
                              double scale) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const uint64_t index = static_cast<uint64_t>(i);
    const double z = Normal ? static_cast<double>(philox::normal_at(seed, offset, index))
                            : static_cast<double>(philox::uniform_at(seed, offset, index));
    out[i] = convert<T>(__dadd_rn(shift, __dmul_rn(scale, z)));
  }
}

template <bool Normal>
void launch_random(const Tensor& out, uint64_t seed, uint64_t offset, double shift, double scale, const char* what) {
  DPT_CHECK(out.is_contiguous(), "{} kernel (CUDA): expected a contiguous tensor", what);
  const int device = device_of(out, {}, what);
  const int64_t n = out.numel();
  if (n == 0) return;
  cuda::DeviceGuard guard(device);
  visit_floating(out.dtype(), what, [&](auto tag) {
    using T = decltype(tag);
    random_kernel<T, Normal><<<grid_for(n, device), kThreads, 0, cuda::current_stream(device)>>>(ptr<T>(out), n, seed,
                                                                                                 offset, shift, scale);
    DPT_CUDA_CHECK_LAUNCH();
  });
}

// Eight consecutive elements as one register-resident vector: whole-vector accesses where every pointer
// is aligned for them (a warp then moves whole cache lines), one element at a time otherwise and for the
// last, partial chunk.
template <class T>
using Chunk = Vec<T, philox::kDropoutGroup>;
template <class T>
__device__ __forceinline__ Chunk<T> load_chunk(const T* __restrict__ from, int count, bool vector) {
  if (vector && count == philox::kDropoutGroup) return *reinterpret_cast<const Chunk<T>*>(from);
  Chunk<T> to;
#pragma unroll
  for (int j = 0; j < philox::kDropoutGroup; ++j) {  // constant indices keep the chunk in registers
    if (j < count) to.v[j] = from[j];
  }
  return to;
}
template <class T>
__device__ __forceinline__ void store_chunk(const Chunk<T>& from, T* __restrict__ to, int count, bool vector) {
  if (vector && count == philox::kDropoutGroup) {
    *reinterpret_cast<Chunk<T>*>(to) = from;
  } else {
#pragma unroll
    for (int j = 0; j < philox::kDropoutGroup; ++j) {
      if (j < count) to[j] = from.v[j];
    }
  }
}

// A thread per chunk of eight elements, whose numbers (philox::dropout_uniform_at) are one Philox call's
// when the draw starts on a multiple of eight, as every draw of whole multiples of eight does, and two
// calls' otherwise (the start may be a device counter's value, known only when the kernel runs). Products
// in float32 (float64 for float64 tensors), and the residual's add after the product, as on the CPU.
template <class T, bool kResidual>
__global__ void dropout_kernel(const T* __restrict__ in, T* __restrict__ out, const T* __restrict__ residual,
                               int64_t n, float threshold, double scale, uint64_t seed, uint64_t offset,
                               const uint64_t* __restrict__ base, bool vector) {
  using A = std::conditional_t<std::is_same_v<T, double>, double, float>;
  constexpr int kGroup = philox::kDropoutGroup;
  const A s = static_cast<A>(scale);
  const uint32_t keep_at = philox::keep_threshold(threshold);
  const uint64_t start = offset + (base != nullptr ? *base : 0), shift = start % kGroup;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x * kGroup;
  for (int64_t i = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * kGroup; i < n; i += stride) {
    const int count = static_cast<int>(n - i < kGroup ? n - i : kGroup);
    const Chunk<T> x = load_chunk(in + i, count, vector);
    Chunk<T> r, y;
    if constexpr (kResidual) r = load_chunk(residual + i, count, vector);
    // Bit j: whether element i + j is kept, from its group's numbers and, when shifted, the next group's.
    const uint64_t group = (start + static_cast<uint64_t>(i)) / kGroup;
    uint32_t keep = philox::keep_bits(philox::dropout_words(seed, group), keep_at);
    if (shift != 0) {
      keep = (keep | philox::keep_bits(philox::dropout_words(seed, group + 1), keep_at) << kGroup) >> shift;
    }
#pragma unroll
    for (int j = 0; j < kGroup; ++j) {
      const A kept = (keep >> j) & 1 ? convert<A>(x.v[j]) * s : A(0);
      y.v[j] = convert<T>(kResidual ? convert<A>(r.v[j]) + kept : kept);
    }
    store_chunk(y, out + i, count, vector);
  }
}

__global__ void advance_counter_kernel(uint64_t* counter, uint64_t amount) { *counter += amount; }

__global__ void philox_state_kernel(int64_t* state, uint64_t seed, uint64_t offset, const uint64_t* base) {
  state[0] = static_cast<int64_t>(seed);
  state[1] = static_cast<int64_t>(offset + (base != nullptr ? *base : 0));
}

}  // namespace

void dropout(const Tensor& in, const Tensor& out, double p, const PhiloxArgs& rng, const Tensor& residual) {
  DPT_CHECK(in.is_contiguous() && out.is_contiguous() && in.numel() == out.numel() && in.dtype() == out.dtype(),
            "dropout kernel (CUDA): expected contiguous input and output of one shape and dtype");
  DPT_CHECK(!residual.defined() || (residual.is_contiguous() && residual.numel() == out.numel() &&
                                    residual.dtype() == out.dtype()),
            "dropout kernel (CUDA): expected a contiguous residual of the output's shape and dtype");
  const int device = device_of(out, {&in, &residual}, "dropout");
  const int64_t n = out.numel();
  if (n == 0) return;
  cuda::DeviceGuard guard(device);
  visit_floating(out.dtype(), "dropout", [&](auto tag) {
    using T = decltype(tag);
    const unsigned grid = grid_for(n / philox::kDropoutGroup + 1, device);
    const cudaStream_t stream = cuda::current_stream(device);
    const float threshold = static_cast<float>(p);
    const double scale = 1.0 / (1.0 - p);
    auto aligned = [](const Tensor& t) {
      return !t.defined() || reinterpret_cast<uintptr_t>(t.data_ptr()) % alignof(Chunk<T>) == 0;
    };
    const bool vector = aligned(in) && aligned(out) && aligned(residual);
    if (residual.defined()) {
      dropout_kernel<T, true><<<grid, kThreads, 0, stream>>>(ptr<T>(in), ptr<T>(out), ptr<T>(residual), n, threshold,
                                                            scale, rng.seed, rng.offset, rng.base, vector);
    } else {
      dropout_kernel<T, false><<<grid, kThreads, 0, stream>>>(ptr<T>(in), ptr<T>(out), nullptr, n, threshold, scale,
                                                             rng.seed, rng.offset, rng.base, vector);
    }
    DPT_CUDA_CHECK_LAUNCH();
  });
}

void advance_counter(const Tensor& counter, uint64_t amount) {
  DPT_CHECK(counter.dtype() == DType::Int64 && counter.numel() == 1, "advance_counter: expected an int64 [1] tensor");
  const int device = device_of(counter, {}, "advance_counter");
  cuda::DeviceGuard guard(device);
  advance_counter_kernel<<<1, 1, 0, cuda::current_stream(device)>>>(reinterpret_cast<uint64_t*>(ptr<int64_t>(counter)),
                                                                     amount);
  DPT_CUDA_CHECK_LAUNCH();
}

void philox_state(const PhiloxArgs& rng, const Tensor& state) {
  DPT_CHECK(state.dtype() == DType::Int64 && state.numel() == 2 && state.is_contiguous(),
            "philox_state: expected a contiguous int64 [2] tensor");
  const int device = device_of(state, {}, "philox_state");
  cuda::DeviceGuard guard(device);
  philox_state_kernel<<<1, 1, 0, cuda::current_stream(device)>>>(ptr<int64_t>(state), rng.seed, rng.offset, rng.base);
  DPT_CUDA_CHECK_LAUNCH();
}

void random_normal(const Tensor& out, uint64_t seed, uint64_t offset, double mean, double stddev) {
  launch_random<true>(out, seed, offset, mean, stddev, "random_normal");
}

void random_uniform(const Tensor& out, uint64_t seed, uint64_t offset, double low, double high) {
  launch_random<false>(out, seed, offset, low, high - low, "random_uniform");
}

}  // namespace dpt::cuda_kernels
