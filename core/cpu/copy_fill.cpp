// Copies with dtype conversion, fills and ranges.
#include <cstring>

#include "core/cpu/cpu_kernels.h"
#include "core/cpu/dispatch.h"
#include "core/cpu/strided.h"

namespace dpt::cpu {

void copy_strided(const Tensor& src, const Tensor& dst) {
  DPT_CHECK(src.shape() == dst.shape() && dst.is_contiguous(),
            "copy kernel: source {} must match the contiguous destination {}", shape_str(src.shape()),
            shape_str(dst.shape()));
  if (src.dtype() == dst.dtype() && src.is_contiguous()) {
    if (src.data_ptr() != dst.data_ptr()) std::memmove(dst.data_ptr(), src.data_ptr(), dst.nbytes());
    return;
  }
  visit_all(src.dtype(), [&](auto src_tag) {
    using S = decltype(src_tag);
    visit_all(dst.dtype(), [&](auto dst_tag) {
      using D = decltype(dst_tag);
      const S* ps = src.data<S>();
      D* pd = dst.data<D>();
      for_each_strided<1>(dst.shape(), {&src.strides()},
                          [&](int64_t i, const std::array<int64_t, 1>& o) { pd[i] = convert<D>(ps[o[0]]); });
    });
  });
}

void fill(const Tensor& out, double value) {
  DPT_CHECK(out.is_contiguous(), "fill kernel: expected a contiguous tensor of shape {}", shape_str(out.shape()));
  visit_all(out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    T v = convert<T>(value);
    T* p = out.data<T>();
    const int64_t n = out.numel();
    for (int64_t i = 0; i < n; ++i) p[i] = v;
  });
}

void arange(const Tensor& out) {
  DPT_CHECK(out.is_contiguous(), "arange kernel: expected a contiguous tensor");
  visit_all(out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    T* p = out.data<T>();
    const int64_t n = out.numel();
    for (int64_t i = 0; i < n; ++i) p[i] = convert<T>(i);
  });
}

}  // namespace dpt::cpu
