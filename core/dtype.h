#pragma once
// Element types a Tensor can hold. Floating types carry gradients; integer types hold indices.
#include <cstddef>
#include <cstdint>
#include <string>

namespace dpt {

enum class DType : uint8_t { Float32, BFloat16, Float64, Int32, Int64 };

size_t dtype_size(DType dtype);
const char* dtype_name(DType dtype);  // "float32", "bfloat16", ...
bool is_floating(DType dtype);
DType parse_dtype(const std::string& name);  // inverse of dtype_name; also accepts "fp32", "bf16", "fp64"

}  // namespace dpt
