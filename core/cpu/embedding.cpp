// Embedding lookup and its scatter-add backward; rows of any tensor gathered by index. The backward adds
// rows in index order (no atomics), so repeated indices give the same sum on every run.
#include <algorithm>
#include <cstring>
#include <vector>

#include "core/cpu/cpu_kernels.h"
#include "core/cpu/dispatch.h"

namespace dpt::cpu {

namespace {
template <class I>
int64_t checked_index(I v, int64_t num, const char* what) {
  int64_t i = static_cast<int64_t>(v);
  DPT_CHECK(i >= 0 && i < num, "{}: index {} out of range for {} rows", what, i, num);
  return i;
}

// Row i of out = row indices[i] of src (num rows of row_bytes each), copied as bytes.
void copy_rows(const Tensor& src, int64_t num, size_t row_bytes, const Tensor& indices, const Tensor& out,
               const char* what) {
  const char* s = static_cast<const char*>(src.data_ptr());
  char* o = static_cast<char*>(out.data_ptr());
  visit_index(indices.dtype(), what, [&](auto tag) {
    using I = decltype(tag);
    const I* idx = indices.data<I>();
    for (int64_t i = 0; i < indices.numel(); ++i) {
      std::memcpy(o + i * row_bytes, s + checked_index(idx[i], num, what) * row_bytes, row_bytes);
    }
  });
}
}  // namespace

void embedding(const Tensor& weight, const Tensor& indices, const Tensor& out) {
  DPT_CHECK(weight.dim() == 2 && weight.is_contiguous() && indices.is_contiguous() && out.is_contiguous() &&
                out.numel() == indices.numel() * weight.size(1) && out.dtype() == weight.dtype(),
            "embedding kernel: weight {} and indices {} do not fill output {}", shape_str(weight.shape()),
            shape_str(indices.shape()), shape_str(out.shape()));
  copy_rows(weight, weight.size(0), static_cast<size_t>(weight.size(1)) * dtype_size(weight.dtype()), indices, out,
            "embedding");
}

void gather_rows(const Tensor& src, const Tensor& indices, const Tensor& out) {
  DPT_CHECK(src.dim() >= 1 && src.is_contiguous() && indices.is_contiguous() && out.is_contiguous() &&
                out.dim() == src.dim() && out.size(0) == indices.numel() && out.dtype() == src.dtype() &&
                std::equal(src.shape().begin() + 1, src.shape().end(), out.shape().begin() + 1),
            "gather_rows kernel: rows {} of {} do not fill output {}", shape_str(indices.shape()),
            shape_str(src.shape()), shape_str(out.shape()));
  const size_t row_bytes = src.size(0) == 0 ? 0 : src.nbytes() / static_cast<size_t>(src.size(0));
  copy_rows(src, src.size(0), row_bytes, indices, out, "gather_rows");
}

void embedding_backward(const Tensor& grad_out, const Tensor& indices, const Tensor& grad_weight) {
  DPT_CHECK(grad_weight.dim() == 2 && grad_weight.is_contiguous() && grad_out.is_contiguous() &&
                indices.is_contiguous() && grad_out.numel() == indices.numel() * grad_weight.size(1) &&
                grad_out.dtype() == grad_weight.dtype(),
            "embedding_backward kernel: grad {} and indices {} do not fit grad_weight {}", shape_str(grad_out.shape()),
            shape_str(indices.shape()), shape_str(grad_weight.shape()));
  const int64_t num = grad_weight.size(0), dim = grad_weight.size(1), count = indices.numel();
  visit_floating(grad_weight.dtype(), "embedding_backward", [&](auto tag) {
    using T = decltype(tag);
    using C = Compute<T>;
    const T* g = grad_out.data<T>();
    T* gw = grad_weight.data<T>();
    // Accumulate in the compute type and round once, so bf16 sums of many rows keep their precision; the
    // order is kernels::kEmbeddingLanes's, the CUDA kernel's.
    std::vector<int64_t> rows(static_cast<size_t>(count));
    visit_index(indices.dtype(), "embedding_backward", [&](auto itag) {
      using I = decltype(itag);
      const I* idx = indices.data<I>();
      for (int64_t i = 0; i < count; ++i) rows[static_cast<size_t>(i)] = checked_index(idx[i], num, "embedding");
    });
    // Each row's lookups, in index order (a counting sort).
    std::vector<int64_t> first(static_cast<size_t>(num) + 1, 0), order(static_cast<size_t>(count));
    for (int64_t r : rows) ++first[static_cast<size_t>(r) + 1];
    for (size_t r = 0; r < static_cast<size_t>(num); ++r) first[r + 1] += first[r];
    std::vector<int64_t> next(first.begin(), first.end() - 1);
    for (int64_t i = 0; i < count; ++i) order[static_cast<size_t>(next[static_cast<size_t>(rows[static_cast<size_t>(i)])]++)] = i;
    constexpr int kLanes = kernels::kEmbeddingLanes;
    std::vector<C> lanes(static_cast<size_t>(kLanes * dim));
    for (int64_t r = 0; r < num; ++r) {
      const int64_t begin = first[static_cast<size_t>(r)], end = first[static_cast<size_t>(r) + 1];
      if (begin == end) continue;
      std::fill(lanes.begin(), lanes.end(), C(0));
      for (int64_t k = begin; k < end; ++k) {
        C* lane = lanes.data() + ((k - begin) % kLanes) * dim;
        const T* src = g + order[static_cast<size_t>(k)] * dim;
        for (int64_t d = 0; d < dim; ++d) lane[d] += convert<C>(src[d]);
      }
      T* dst = gw + r * dim;
      for (int64_t d = 0; d < dim; ++d) {
        C sum = convert<C>(dst[d]);
        for (int l = 0; l < kLanes; ++l) sum += lanes[static_cast<size_t>(l * dim + d)];
        dst[d] = convert<T>(sum);
      }
    }
  });
}

}  // namespace dpt::cpu
