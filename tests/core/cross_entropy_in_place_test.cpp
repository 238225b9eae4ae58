// cross_entropy's backward overwrites the logits with their gradient when nobody else holds them
// (core/ops_loss.cpp). These tests pin the three promises of that: the same gradient as the copying
// backward, logits a caller still holds are never touched, and on the GPU the logits' bytes really
// leave the memory peak.
#include <gtest/gtest.h>

#include <string>
#include <utility>

#include "core/cuda_runtime.h"
#include "core/error.h"
#include "core/factory.h"
#include "core/ops.h"

namespace dpt {
namespace {

struct Problem {
  Tensor h, w, targets;
};

// logits = h @ w: a temporary whose only handle is the one cross_entropy saves.
Problem make_problem(int64_t rows, int64_t features, int64_t classes, const TensorOptions& options) {
  Generator gen(7);
  Problem p;
  p.h = randn({rows, features}, gen, options);
  p.w = randn({features, classes}, gen, options);
  p.w.requires_grad_(true);
  TensorOptions index = options.with_dtype(DType::Int64).with_requires_grad(false);
  p.targets = randint({rows}, 0, classes, gen, index);
  return p;
}

Tensor weight_gradient_in_place(const Problem& p) {
  // Two statements: a temporary lives to the end of its full expression, so in
  // `cross_entropy(matmul(h, w), t).backward()` the logits would still be held during backward.
  Tensor loss = cross_entropy(matmul(p.h, p.w), p.targets);
  loss.backward();
  Tensor g = p.w.grad().to(Device::cpu()).to(DType::Float64);
  p.w.zero_grad(true);
  return g;
}

// Holding the logits keeps them alive past backward: the copying path, and they must come back intact.
Tensor weight_gradient_holding_logits(const Problem& p) {
  Tensor logits = matmul(p.h, p.w);
  Tensor before = logits.detach().to(Device::cpu()).to(DType::Float64);
  cross_entropy(logits, p.targets).backward();
  EXPECT_EQ(logits.detach().to(Device::cpu()).to(DType::Float64).to_vector<double>(), before.to_vector<double>())
      << "backward overwrote logits the caller still holds";
  Tensor g = p.w.grad().to(Device::cpu()).to(DType::Float64);
  p.w.zero_grad(true);
  return g;
}

TEST(CrossEntropyInPlace, SameGradientAsTheCopyingBackwardAndHeldLogitsUntouched) {
  for (DType dtype : {DType::Float64, DType::Float32, DType::BFloat16}) {
    Problem p = make_problem(12, 6, 37, TensorOptions{}.with_dtype(dtype));
    Tensor in_place = weight_gradient_in_place(p);
    Tensor copying = weight_gradient_holding_logits(p);
    // Same kernel, same inputs, same arithmetic: bit-identical, and not trivially zero.
    EXPECT_EQ(in_place.to_vector<double>(), copying.to_vector<double>()) << dtype_name(dtype);
    EXPECT_GT(sum(mul(in_place, in_place)).item(), 0.01) << dtype_name(dtype);
  }
}

TEST(CrossEntropyInPlace, SecondBackwardThroughTheGraphIsAClearError) {
  Problem p = make_problem(4, 3, 5, TensorOptions{}.with_dtype(DType::Float64));
  Tensor loss = cross_entropy(matmul(p.h, p.w), p.targets);
  loss.backward();
  try {
    loss.backward();
    FAIL() << "a second backward read overwritten logits";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("second backward"), std::string::npos) << e.what();
  }
}

TEST(CrossEntropyInPlace, CudaLogitsLeaveThePeakOfBackward) {
  if (!cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const TensorOptions gpu = TensorOptions{}.with_dtype(DType::BFloat16).with_device(Device::cuda(0));
  Problem p = make_problem(2048, 64, 8192, gpu);  // logits: 2048 x 8192 bf16 = 32 MiB
  const size_t logits_bytes = size_t{2048} * 8192 * 2;
  auto peak_of = [&](auto&& step) {
    cuda::synchronize();
    cuda::reset_peak_memory_stats(0);
    const size_t base = cuda::memory_allocated(0);
    Tensor g = step(p);
    cuda::synchronize();
    return std::make_pair(cuda::max_memory_allocated(0) - base, g);
  };
  auto [held_peak, held_grad] = peak_of(weight_gradient_holding_logits);
  auto [in_place_peak, in_place_grad] = peak_of(weight_gradient_in_place);
  EXPECT_EQ(in_place_grad.to_vector<double>(), held_grad.to_vector<double>());
  EXPECT_GE(held_peak, in_place_peak + logits_bytes * 9 / 10)
      << "peak with the logits held " << held_peak << " B, with them overwritten " << in_place_peak << " B";
}

}  // namespace
}  // namespace dpt
