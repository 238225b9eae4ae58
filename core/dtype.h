#pragma once
// Element types a Tensor can hold. Floating types carry gradients; integer types hold indices.
#include <cstddef>
#include <cstdint>
#include <string>

namespace dpt {

// Float16 comes last so the numeric values of the others (seen in debug checks) stay as they were.
enum class DType : uint8_t { Float32, BFloat16, Float64, Int32, Int64, Float16 };

size_t dtype_size(DType dtype);
const char* dtype_name(DType dtype);  // "float32", "bfloat16", "float16", ...
bool is_floating(DType dtype);
DType parse_dtype(const std::string& name);  // inverse of dtype_name; also accepts "fp32", "bf16", "fp16", "half", "fp64"

}  // namespace dpt
