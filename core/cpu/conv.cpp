// CPU convolution helpers and pooling (see core/conv_kernels.h). Plain loops: the heavy part of a
// convolution is the matmul that follows im2col, which runs in the gemm kernel.
#include <algorithm>
#include <limits>
#include <type_traits>
#include <vector>

#include "core/bfloat16.h"
#include "core/float16.h"
#include "core/conv_kernels.h"
#include "core/error.h"

namespace dpt::conv::cpu {

namespace {

// Accumulate in double for float64, in float otherwise (bf16 and f16 round once, on store).
template <class T>
using Acc = std::conditional_t<std::is_same_v<T, double>, double, float>;

template <class T>
Acc<T> load(T v) {
  return static_cast<Acc<T>>(v);
}

template <class F>
void dispatch(DType dtype, const char* op, F&& f) {
  switch (dtype) {
    case DType::Float32: f(float{}); break;
    case DType::Float64: f(double{}); break;
    case DType::BFloat16: f(bf16{}); break;
    case DType::Float16: f(f16{}); break;
    default: DPT_FAIL("{}: expected a floating tensor, found {}", op, dtype_name(dtype));
  }
}

// Calls f(ih, iw, i, j) for each in-bounds input position of output pixel (oh, ow).
template <class F>
inline void for_window(const Geometry& g, int64_t oh, int64_t ow, F&& f) {
  for (int64_t i = 0; i < g.kh; ++i) {
    int64_t ih = oh * g.stride - g.padding + i;
    if (ih < 0 || ih >= g.h) continue;
    for (int64_t j = 0; j < g.kw; ++j) {
      int64_t iw = ow * g.stride - g.padding + j;
      if (iw < 0 || iw >= g.w) continue;
      f(ih, iw, i, j);
    }
  }
}

}  // namespace

void im2col(const Tensor& x, const Tensor& cols, const Geometry& g) {
  dispatch(x.dtype(), "im2col", [&](auto tag) {
    using T = decltype(tag);
    const T* src = x.data<T>();
    T* dst = cols.data<T>();
    const int64_t l = g.ho * g.wo, rows = g.c * g.kh * g.kw;
    for (int64_t n = 0; n < g.n; ++n) {
      for (int64_t c = 0; c < g.c; ++c) {
        const T* plane = src + (n * g.c + c) * g.h * g.w;
        for (int64_t i = 0; i < g.kh; ++i) {
          for (int64_t j = 0; j < g.kw; ++j) {
            T* row = dst + (n * rows + (c * g.kh + i) * g.kw + j) * l;
            for (int64_t oh = 0; oh < g.ho; ++oh) {
              const int64_t ih = oh * g.stride - g.padding + i;
              for (int64_t ow = 0; ow < g.wo; ++ow) {
                const int64_t iw = ow * g.stride - g.padding + j;
                row[oh * g.wo + ow] = (ih >= 0 && ih < g.h && iw >= 0 && iw < g.w) ? plane[ih * g.w + iw] : T(0.0f);
              }
            }
          }
        }
      }
    }
  });
}

void col2im(const Tensor& cols, const Tensor& dx, const Geometry& g) {
  dispatch(dx.dtype(), "col2im", [&](auto tag) {
    using T = decltype(tag);
    const T* src = cols.data<T>();
    T* dst = dx.data<T>();
    const int64_t l = g.ho * g.wo, rows = g.c * g.kh * g.kw;
    std::vector<Acc<T>> plane(static_cast<size_t>(g.h * g.w));
    for (int64_t n = 0; n < g.n; ++n) {
      for (int64_t c = 0; c < g.c; ++c) {
        std::fill(plane.begin(), plane.end(), Acc<T>(0));
        for (int64_t i = 0; i < g.kh; ++i) {
          for (int64_t j = 0; j < g.kw; ++j) {
            const T* row = src + (n * rows + (c * g.kh + i) * g.kw + j) * l;
            for (int64_t oh = 0; oh < g.ho; ++oh) {
              const int64_t ih = oh * g.stride - g.padding + i;
              if (ih < 0 || ih >= g.h) continue;
              for (int64_t ow = 0; ow < g.wo; ++ow) {
                const int64_t iw = ow * g.stride - g.padding + j;
                if (iw >= 0 && iw < g.w) plane[static_cast<size_t>(ih * g.w + iw)] += load(row[oh * g.wo + ow]);
              }
            }
          }
        }
        T* out = dst + (n * g.c + c) * g.h * g.w;
        for (int64_t k = 0; k < g.h * g.w; ++k) out[k] = T(plane[static_cast<size_t>(k)]);
      }
    }
  });
}

void max_pool2d(const Tensor& x, const Tensor& y, const Tensor& indices, const Geometry& g) {
  dispatch(x.dtype(), "max_pool2d", [&](auto tag) {
    using T = decltype(tag);
    const T* src = x.data<T>();
    T* dst = y.data<T>();
    int64_t* idx = indices.data<int64_t>();
    for (int64_t p = 0; p < g.n * g.c; ++p) {
      const T* plane = src + p * g.h * g.w;
      for (int64_t oh = 0; oh < g.ho; ++oh) {
        for (int64_t ow = 0; ow < g.wo; ++ow) {
          Acc<T> best = -std::numeric_limits<Acc<T>>::infinity();
          int64_t arg = -1;
          for_window(g, oh, ow, [&](int64_t ih, int64_t iw, int64_t, int64_t) {
            Acc<T> v = load(plane[ih * g.w + iw]);
            if (arg < 0 || v > best) {
              best = v;
              arg = ih * g.w + iw;
            }
          });
          const int64_t o = (p * g.ho + oh) * g.wo + ow;
          dst[o] = T(best);
          idx[o] = arg;
        }
      }
    }
  });
}

void max_pool2d_backward(const Tensor& dy, const Tensor& indices, const Tensor& dx, const Geometry& g) {
  dispatch(dx.dtype(), "max_pool2d_backward", [&](auto tag) {
    using T = decltype(tag);
    const T* src = dy.data<T>();
    const int64_t* idx = indices.data<int64_t>();
    T* dst = dx.data<T>();
    std::vector<Acc<T>> plane(static_cast<size_t>(g.h * g.w));
    for (int64_t p = 0; p < g.n * g.c; ++p) {
      std::fill(plane.begin(), plane.end(), Acc<T>(0));
      for (int64_t k = 0; k < g.ho * g.wo; ++k) {
        const int64_t o = p * g.ho * g.wo + k;
        if (idx[o] >= 0) plane[static_cast<size_t>(idx[o])] += load(src[o]);
      }
      for (int64_t k = 0; k < g.h * g.w; ++k) dst[p * g.h * g.w + k] = T(plane[static_cast<size_t>(k)]);
    }
  });
}

void avg_pool2d(const Tensor& x, const Tensor& y, const Geometry& g) {
  dispatch(x.dtype(), "avg_pool2d", [&](auto tag) {
    using T = decltype(tag);
    const T* src = x.data<T>();
    T* dst = y.data<T>();
    const Acc<T> inv = Acc<T>(1) / static_cast<Acc<T>>(g.kh * g.kw);
    for (int64_t p = 0; p < g.n * g.c; ++p) {
      const T* plane = src + p * g.h * g.w;
      for (int64_t oh = 0; oh < g.ho; ++oh) {
        for (int64_t ow = 0; ow < g.wo; ++ow) {
          Acc<T> s = 0;
          for_window(g, oh, ow, [&](int64_t ih, int64_t iw, int64_t, int64_t) { s += load(plane[ih * g.w + iw]); });
          dst[(p * g.ho + oh) * g.wo + ow] = T(s * inv);
        }
      }
    }
  });
}

void avg_pool2d_backward(const Tensor& dy, const Tensor& dx, const Geometry& g) {
  dispatch(dx.dtype(), "avg_pool2d_backward", [&](auto tag) {
    using T = decltype(tag);
    const T* src = dy.data<T>();
    T* dst = dx.data<T>();
    const Acc<T> inv = Acc<T>(1) / static_cast<Acc<T>>(g.kh * g.kw);
    std::vector<Acc<T>> plane(static_cast<size_t>(g.h * g.w));
    for (int64_t p = 0; p < g.n * g.c; ++p) {
      std::fill(plane.begin(), plane.end(), Acc<T>(0));
      for (int64_t oh = 0; oh < g.ho; ++oh) {
        for (int64_t ow = 0; ow < g.wo; ++ow) {
          const Acc<T> v = load(src[(p * g.ho + oh) * g.wo + ow]) * inv;
          for_window(g, oh, ow, [&](int64_t ih, int64_t iw, int64_t, int64_t) {
            plane[static_cast<size_t>(ih * g.w + iw)] += v;
          });
        }
      }
      for (int64_t k = 0; k < g.h * g.w; ++k) dst[p * g.h * g.w + k] = T(plane[static_cast<size_t>(k)]);
    }
  });
}

}  // namespace dpt::conv::cpu
