#pragma once
// Enums and argument structs shared by the kernel declarations of every backend.
#include <cstdint>

namespace dpt::kernels {

enum class UnaryOp {
  Neg, Exp, Log, Sqrt, Pow, Relu, Gelu, Tanh, Sigmoid,
  ReluGrad,  // 1 where x > 0 else 0
  GeluGrad,  // d gelu(x) / dx
  Scale,     // x * scalar
  AddScalar  // x + scalar
};
enum class BinaryOp { Add, Sub, Mul, Div };
enum class ReduceOp { Sum, Max };

struct GemmArgs {
  int64_t batch = 1, m = 0, n = 0, k = 0;
  bool transpose_a = false, transpose_b = false;
  int64_t stride_a = 0, stride_b = 0, stride_c = 0;
  double alpha = 1, beta = 0;
};

}  // namespace dpt::kernels
