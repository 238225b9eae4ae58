#pragma once
// Dtype dispatch for the CPU kernels: one switch, written once, instead of a switch per kernel.
//
//   visit_floating(dtype, [&](auto tag) { using T = decltype(tag); ... });
//
// The lambda receives a value of the element type (float, double, bf16 or f16; visit_all adds int32_t
// and int64_t). Arithmetic happens in Compute<T>: float for bfloat16 and float16 (round once, on
// store), the type itself otherwise, so a bf16 or f16 kernel reads as the float one.
#include <cstdint>
#include <type_traits>

#include "core/bfloat16.h"
#include "core/dtype.h"
#include "core/dtype_visit.h"
#include "core/error.h"
#include "core/float16.h"

namespace dpt::cpu {

// True for the 16-bit floating types, which are stored narrow and computed in float.
template <class T>
constexpr bool kIsHalfWidth = std::is_same_v<T, bf16> || std::is_same_v<T, f16>;

template <class T>
using Compute = std::conditional_t<kIsHalfWidth<T>, float, T>;

// Converts between any two element types: integers directly, bf16 and f16 through float.
template <class To, class From>
inline To convert(From v) {
  if constexpr (std::is_same_v<To, From>) {
    return v;
  } else if constexpr (kIsHalfWidth<To>) {
    return To(static_cast<float>(v));
  } else if constexpr (kIsHalfWidth<From>) {
    return static_cast<To>(static_cast<float>(v));
  } else {
    return static_cast<To>(v);
  }
}

template <class F>
decltype(auto) visit_floating(DType dtype, const char* what, F&& f) {
  return dtype_visit::floating<bf16, f16>(dtype, what, "", std::forward<F>(f));
}

template <class F>
decltype(auto) visit_all(DType dtype, F&& f) {
  return dtype_visit::all<bf16, f16>(dtype, std::forward<F>(f));
}

template <class F>
decltype(auto) visit_index(DType dtype, const char* what, F&& f) {
  return dtype_visit::index(dtype, what, "", std::forward<F>(f));
}

}  // namespace dpt::cpu
