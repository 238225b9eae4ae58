#pragma once
// Enums and argument structs shared by the kernel declarations of every backend.
#include <cstdint>

namespace dpt {

// Where a random draw starts: counter `offset` of stream `seed`, plus, when `base` is set, the value of a
// device-resident counter read by the kernel when it runs. A CUDA graph holds kernels with `base` set,
// so every replay draws fresh numbers once the counter has moved on (Generator::begin_capture).
struct PhiloxArgs {
  uint64_t seed = 0;
  uint64_t offset = 0;
  const uint64_t* base = nullptr;
};

}  // namespace dpt

namespace dpt::kernels {

// embedding_backward's summation order, the same on every device (so CPU and CUDA agree bit for bit): the
// k-th lookup of a row (in index order) is added to partial sum k % kEmbeddingLanes, and the row's gradient
// becomes its old value plus the partial sums in order. Spreading a row's lookups over lanes is what lets a
// GPU sum the rows of a small vocabulary, each looked up thousands of times, in parallel.
constexpr int kEmbeddingLanes = 8;

enum class UnaryOp {
  Neg, Exp, Log, Sqrt, Pow, Relu, Gelu, Tanh, Sigmoid,
  Sign,  // -1, 0 or 1 (NaN stays NaN)
  Abs,
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
