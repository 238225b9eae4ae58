#pragma once
// Runtime dtype -> compile-time element type, written once for both backends. `BF16` and `F16` are the
// backend's bfloat16 and float16 types (dpt::bf16 / dpt::f16 on the host, __nv_bfloat16 / __half in
// CUDA code) and `backend` is appended to the op's name in errors ("" or " (CUDA)"). Backends wrap
// these as visit_floating / visit_all / visit_index.
#include <cstdint>
#include <utility>

#include "core/dtype.h"
#include "core/error.h"

namespace dpt::dtype_visit {

template <class BF16, class F16, class F>
decltype(auto) floating(DType dtype, const char* what, const char* backend, F&& f) {
  switch (dtype) {
    case DType::Float32:
      return f(float{});
    case DType::Float64:
      return f(double{});
    case DType::BFloat16:
      return f(BF16{});
    case DType::Float16:
      return f(F16{});
    default:
      break;
  }
  DPT_FAIL("{}{}: expected a floating dtype (float32, float64, bfloat16, float16), found {}", what, backend,
           dtype_name(dtype));
}

template <class BF16, class F16, class F>
decltype(auto) all(DType dtype, F&& f) {
  switch (dtype) {
    case DType::Float32:
      return f(float{});
    case DType::Float64:
      return f(double{});
    case DType::BFloat16:
      return f(BF16{});
    case DType::Float16:
      return f(F16{});
    case DType::Int32:
      return f(int32_t{});
    case DType::Int64:
      return f(int64_t{});
  }
  DPT_FAIL("unknown dtype {}", static_cast<int>(dtype));
}

template <class F>
decltype(auto) index(DType dtype, const char* what, const char* backend, F&& f) {
  switch (dtype) {
    case DType::Int32:
      return f(int32_t{});
    case DType::Int64:
      return f(int64_t{});
    default:
      break;
  }
  DPT_FAIL("{}{}: expected int32 or int64 indices, found {}", what, backend, dtype_name(dtype));
}

}  // namespace dpt::dtype_visit
