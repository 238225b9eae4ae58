// Causal softmax on the CPU, statistics in double: the reference for the CUDA kernel.
#include <cmath>

#include "core/attention_kernels.h"
#include "core/cpu/dispatch.h"

namespace dpt::cpu {

void causal_softmax_forward(const Tensor& x, const Tensor& y, int64_t rows, int64_t t, double scale) {
  visit_floating(x.dtype(), "causal_softmax", [&](auto tag) {
    using T = decltype(tag);
    for (int64_t r = 0; r < rows; ++r) {
      const T* xr = x.data<T>() + r * t;
      T* yr = y.data<T>() + r * t;
      const int64_t last = r % t;  // query position: keys 0..last are visible
      double m = -INFINITY;
      for (int64_t j = 0; j <= last; ++j) m = std::max(m, scale * convert<double>(xr[j]));
      double sum = 0;
      for (int64_t j = 0; j <= last; ++j) sum += std::exp(scale * convert<double>(xr[j]) - m);
      for (int64_t j = 0; j < t; ++j) {
        yr[j] = convert<T>(j <= last ? std::exp(scale * convert<double>(xr[j]) - m) / sum : 0.0);
      }
    }
  });
}

void causal_softmax_backward(const Tensor& grad_y, const Tensor& y, const Tensor& grad_x, int64_t rows, int64_t t,
                             double scale) {
  visit_floating(y.dtype(), "causal_softmax backward", [&](auto tag) {
    using T = decltype(tag);
    for (int64_t r = 0; r < rows; ++r) {
      const T* gyr = grad_y.data<T>() + r * t;
      const T* yr = y.data<T>() + r * t;
      T* gxr = grad_x.data<T>() + r * t;
      const int64_t last = r % t;
      double dot = 0;
      for (int64_t j = 0; j <= last; ++j) dot += convert<double>(gyr[j]) * convert<double>(yr[j]);
      for (int64_t j = 0; j < t; ++j) {
        gxr[j] = convert<T>(j <= last ? scale * convert<double>(yr[j]) * (convert<double>(gyr[j]) - dot) : 0.0);
      }
    }
  });
}

}  // namespace dpt::cpu
