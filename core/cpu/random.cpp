// Random fills. Element i is a pure function of (seed, offset + i) through Philox (core/philox.h), the
// same function the CUDA kernels call, so a draw is identical on both devices. The affine map
// (mean + stddev * z, low + (high - low) * u) is evaluated in double and rounded once to the dtype.
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

}  // namespace dpt::cpu
