#pragma once
// Dtype dispatch for the CPU kernels: one switch, written once, instead of a switch per kernel.
//
//   visit_floating(dtype, [&](auto tag) { using T = decltype(tag); ... });
//
// The lambda receives a value of the element type (float, double or bf16; visit_all adds int32_t and
// int64_t). Arithmetic happens in Compute<T>: float for bfloat16 (round once, on store), the type
// itself otherwise, so a bf16 kernel reads as the float one.
#include <cstdint>
#include <type_traits>

#include "core/bfloat16.h"
#include "core/dtype.h"
#include "core/error.h"

namespace dpt::cpu {

template <class T>
using Compute = std::conditional_t<std::is_same_v<T, bf16>, float, T>;

// Converts between any two element types: integers directly, bf16 through float.
template <class To, class From>
inline To convert(From v) {
  if constexpr (std::is_same_v<To, From>) {
    return v;
  } else if constexpr (std::is_same_v<To, bf16>) {
    return bf16(static_cast<float>(v));
  } else if constexpr (std::is_same_v<From, bf16>) {
    return static_cast<To>(static_cast<float>(v));
  } else {
    return static_cast<To>(v);
  }
}

template <class F>
decltype(auto) visit_floating(DType dtype, const char* what, F&& f) {
  switch (dtype) {
    case DType::Float32:
      return f(float{});
    case DType::Float64:
      return f(double{});
    case DType::BFloat16:
      return f(bf16{});
    default:
      break;
  }
  DPT_FAIL("{}: expected a floating dtype (float32, float64, bfloat16), found {}", what, dtype_name(dtype));
}

template <class F>
decltype(auto) visit_all(DType dtype, F&& f) {
  switch (dtype) {
    case DType::Float32:
      return f(float{});
    case DType::Float64:
      return f(double{});
    case DType::BFloat16:
      return f(bf16{});
    case DType::Int32:
      return f(int32_t{});
    case DType::Int64:
      return f(int64_t{});
  }
  DPT_FAIL("unknown dtype {}", static_cast<int>(dtype));
}

template <class F>
decltype(auto) visit_index(DType dtype, const char* what, F&& f) {
  switch (dtype) {
    case DType::Int32:
      return f(int32_t{});
    case DType::Int64:
      return f(int64_t{});
    default:
      break;
  }
  DPT_FAIL("{}: expected int32 or int64 indices, found {}", what, dtype_name(dtype));
}

}  // namespace dpt::cpu
