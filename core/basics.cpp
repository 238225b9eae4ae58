// Small value types: dtypes, devices, shapes and the error helper.
#include <algorithm>
#include <sstream>

#include "core/device.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/shape.h"

namespace dpt {

void throw_error(const char* file, int line, const std::string& message) {
  std::string where = file;
  auto slash = where.rfind("/core/");
  if (slash == std::string::npos) slash = where.find_last_of('/');
  throw Error(fmt::format("{} ({}:{})", message, where.substr(slash == std::string::npos ? 0 : slash + 1), line));
}

size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::Float32: return 4;
    case DType::BFloat16: return 2;
    case DType::Float16: return 2;
    case DType::Float64: return 8;
    case DType::Int32: return 4;
    case DType::Int64: return 8;
  }
  return 0;
}

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::Float32: return "float32";
    case DType::BFloat16: return "bfloat16";
    case DType::Float16: return "float16";
    case DType::Float64: return "float64";
    case DType::Int32: return "int32";
    case DType::Int64: return "int64";
  }
  return "?";
}

bool is_floating(DType dtype) {
  return dtype == DType::Float32 || dtype == DType::BFloat16 || dtype == DType::Float16 || dtype == DType::Float64;
}

DType parse_dtype(const std::string& name) {
  if (name == "float32" || name == "fp32" || name == "f32") return DType::Float32;
  if (name == "bfloat16" || name == "bf16") return DType::BFloat16;
  if (name == "float16" || name == "fp16" || name == "f16" || name == "half") return DType::Float16;
  if (name == "float64" || name == "fp64" || name == "f64") return DType::Float64;
  if (name == "int32") return DType::Int32;
  if (name == "int64") return DType::Int64;
  DPT_FAIL("unknown dtype '{}' (expected float32, bfloat16, float16, float64, int32 or int64)", name);
}

Device Device::parse(const std::string& text) {
  if (text == "cpu") return cpu();
  if (text == "cuda") return cuda(0);
  if (text.rfind("cuda:", 0) == 0) {
    std::string index = text.substr(5);
    DPT_CHECK(!index.empty() && std::all_of(index.begin(), index.end(), ::isdigit),
              "bad device '{}' (expected cpu, cuda or cuda:N)", text);
    return cuda(std::stoi(index));
  }
  DPT_FAIL("bad device '{}' (expected cpu, cuda or cuda:N)", text);
}

std::string Device::str() const { return is_cpu() ? "cpu" : fmt::format("cuda:{}", index); }

int64_t shape_numel(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) DPT_CHECK(!__builtin_mul_overflow(n, d, &n), "shape {} overflows int64", shape_str(shape));
  return n;
}

Shape contiguous_strides(const Shape& shape) {
  Shape strides(shape.size());
  int64_t s = 1;
  // A zero extent counts as 1: the strides of an empty tensor are those of the same shape with 1 there.
  for (size_t i = shape.size(); i-- > 0;) {
    strides[i] = s;
    DPT_CHECK(!__builtin_mul_overflow(s, std::max<int64_t>(shape[i], 1), &s), "shape {} overflows int64",
              shape_str(shape));
  }
  return strides;
}

std::string shape_str(const Shape& shape) {
  std::ostringstream os;
  os << '[';
  for (size_t i = 0; i < shape.size(); ++i) os << (i ? ", " : "") << shape[i];
  os << ']';
  return os.str();
}

int64_t wrap_dim(int64_t dim, int64_t rank, const char* op) {
  int64_t wrapped = dim < 0 ? dim + rank : dim;
  DPT_CHECK(wrapped >= 0 && wrapped < std::max<int64_t>(rank, 1), "{}: dimension {} out of range for rank {}", op,
            dim, rank);
  return wrapped;
}

Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op) {
  size_t rank = std::max(a.size(), b.size());
  Shape out(rank);
  for (size_t i = 0; i < rank; ++i) {
    int64_t da = i < rank - a.size() ? 1 : a[i - (rank - a.size())];
    int64_t db = i < rank - b.size() ? 1 : b[i - (rank - b.size())];
    DPT_CHECK(da == db || da == 1 || db == 1, "{}: shapes {} and {} do not broadcast", op, shape_str(a), shape_str(b));
    out[i] = da == 1 ? db : da;
  }
  return out;
}

}  // namespace dpt
