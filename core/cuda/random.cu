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

// Grid-stride over elements, one Philox call each (the CPU kernel's very function), in float32.
// A thread per group of four Philox numbers (philox::dropout_uniform_at): one call, up to four elements.
// Products in float32 (float64 for float64 tensors), as on the CPU.
template <class T>
__global__ void dropout_kernel(const T* __restrict__ in, T* __restrict__ out, int64_t n, float threshold,
                               double scale, uint64_t seed, uint64_t offset, const uint64_t* __restrict__ base) {
  using A = std::conditional_t<std::is_same_v<T, double>, double, float>;
  const A s = static_cast<A>(scale);
  const uint64_t start = offset + (base != nullptr ? *base : 0);
  const uint64_t first = start >> 2, groups = ((start + static_cast<uint64_t>(n) - 1) >> 2) - first + 1;
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  for (uint64_t g = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; g < groups; g += stride) {
    const philox::Words w = philox::dropout_words(seed, first + g);
#pragma unroll
    for (uint64_t word = 0; word < 4; ++word) {
      const int64_t i = static_cast<int64_t>(4 * (first + g) + word - start);  // the element of this number
      if (i < 0 || i >= n) continue;
      const bool keep = philox::word_of(w, word) > threshold;
      out[i] = keep ? convert<T>(convert<A>(in[i]) * s) : convert<T>(A(0));
    }
  }
}

__global__ void advance_counter_kernel(uint64_t* counter, uint64_t amount) { *counter += amount; }

}  // namespace

void dropout(const Tensor& in, const Tensor& out, double p, const PhiloxArgs& rng) {
  DPT_CHECK(in.is_contiguous() && out.is_contiguous() && in.numel() == out.numel() && in.dtype() == out.dtype(),
            "dropout kernel (CUDA): expected contiguous input and output of one shape and dtype");
  const int device = device_of(out, {&in}, "dropout");
  const int64_t n = out.numel();
  if (n == 0) return;
  cuda::DeviceGuard guard(device);
  visit_floating(out.dtype(), "dropout", [&](auto tag) {
    using T = decltype(tag);
    dropout_kernel<T><<<grid_for(n / 4 + 1, device), kThreads, 0, cuda::current_stream(device)>>>(
        ptr<T>(in), ptr<T>(out), n, static_cast<float>(p), 1.0 / (1.0 - p), rng.seed, rng.offset, rng.base);
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

void random_normal(const Tensor& out, uint64_t seed, uint64_t offset, double mean, double stddev) {
  launch_random<true>(out, seed, offset, mean, stddev, "random_normal");
}

void random_uniform(const Tensor& out, uint64_t seed, uint64_t offset, double low, double high) {
  launch_random<false>(out, seed, offset, low, high - low, "random_uniform");
}

}  // namespace dpt::cuda_kernels
