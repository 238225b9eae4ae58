// Random fills. Element i is a pure function of (seed, offset + i) through Philox (core/philox.h), the
// same function the CUDA kernels call, so a draw is identical on both devices. The affine map
// (mean + stddev * z, low + (high - low) * u) is evaluated in double and rounded once to the dtype.
#include <type_traits>

#include "core/cpu/cpu_kernels.h"
#include "core/cpu/dispatch.h"
#include "core/philox.h"

namespace dpt::cpu {

void random_normal(const Tensor& out, uint64_t seed, uint64_t offset, double mean, double stddev) {
  DPT_CHECK(out.is_contiguous(), "random_normal kernel: expected a contiguous tensor");
  visit_floating(out.dtype(), "random_normal", [&](auto tag) {
    using T = decltype(tag);
    T* p = out.data<T>();
    const int64_t n = out.numel();
    for (int64_t i = 0; i < n; ++i) {
      double z = philox::normal_at(seed, offset, static_cast<uint64_t>(i));
      p[i] = convert<T>(mean + stddev * z);
    }
  });
}

void random_uniform(const Tensor& out, uint64_t seed, uint64_t offset, double low, double high) {
  DPT_CHECK(out.is_contiguous(), "random_uniform kernel: expected a contiguous tensor");
  visit_floating(out.dtype(), "random_uniform", [&](auto tag) {
    using T = decltype(tag);
    T* p = out.data<T>();
    const int64_t n = out.numel();
    for (int64_t i = 0; i < n; ++i) {
      double u = philox::uniform_at(seed, offset, static_cast<uint64_t>(i));
      p[i] = convert<T>(low + (high - low) * u);
    }
  });
}

void dropout(const Tensor& in, const Tensor& out, double p, const PhiloxArgs& rng, const Tensor& residual) {
  DPT_CHECK(in.is_contiguous() && out.is_contiguous() && in.numel() == out.numel() && in.dtype() == out.dtype(),
            "dropout kernel: expected contiguous input and output of one shape and dtype");
  DPT_CHECK(!residual.defined() || (residual.is_contiguous() && residual.numel() == out.numel() &&
                                    residual.dtype() == out.dtype()),
            "dropout kernel: expected a contiguous residual of the output's shape and dtype");
  DPT_CHECK(rng.base == nullptr, "dropout kernel: a device counter has no meaning on the CPU");
  const float threshold = static_cast<float>(p);
  visit_floating(out.dtype(), "dropout", [&](auto tag) {
    using T = decltype(tag);
    using A = std::conditional_t<std::is_same_v<T, double>, double, float>;  // as the CUDA kernel
    const A scale = static_cast<A>(1.0 / (1.0 - p));
    const T* x = in.data<T>();
    const T* r = residual.defined() ? residual.data<T>() : nullptr;
    T* y = out.data<T>();
    const int64_t n = out.numel();
    for (int64_t i = 0; i < n; ++i) {
      const bool keep = philox::dropout_uniform_at(rng.seed, rng.offset, static_cast<uint64_t>(i)) > threshold;
      const A kept = keep ? convert<A>(x[i]) * scale : A(0);
      y[i] = convert<T>(r ? convert<A>(r[i]) + kept : kept);
    }
  });
}

void advance_counter(const Tensor& counter, uint64_t amount) {
  DPT_CHECK(counter.dtype() == DType::Int64 && counter.numel() == 1, "advance_counter: expected an int64 [1] tensor");
  auto* c = reinterpret_cast<uint64_t*>(counter.data<int64_t>());
  *c += amount;
}

}  // namespace dpt::cpu
