// Cross-entropy of a confident row in float32: the target's logit far above the rest (a memorised batch),
// so the loss and the target's gradient are a small r = sum of exp(x_j - max) over the other classes.
// Computed as logsumexp - x_t, both lose r's digits at the rounding of logsumexp (about ulp(max), 1e-2 of
// r here), and a sum that starts from the max's 1 rounds the small terms away. The kernels keep r apart
// from the max's 1 and take the loss as (max - x_t) + log1p(r) and the target's softmax - 1 through
// expm1 (core/kernel_decls.inc). Checked against float64 arithmetic on the same float32 logits, on the CPU
// and on CUDA, through the two-pass and the fused (handed-over logits) paths; so are rows with classes
// masked to -inf, which must count as absent.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "core/autograd.h"
#include "core/cuda_runtime.h"
#include "core/factory.h"
#include "core/ops.h"

namespace dpt {
namespace {

struct Row {
  std::vector<float> logits;
  int64_t target;
};

// The target's logit at 24 + shift, every other logit 17-19 below it: r is about 1e-4 at 4096 classes.
// With `runner_up`, another class sits 3 above the target, so the target is not the max.
Row confident_row(int64_t classes, int64_t target, float shift, bool runner_up, uint64_t seed) {
  Generator gen(seed);
  const std::vector<double> u = rand({classes}, gen, TensorOptions{}.with_dtype(DType::Float64)).to_vector<double>();
  Row row{std::vector<float>(static_cast<size_t>(classes)), target};
  const double top = 24.0 + shift;
  for (int64_t j = 0; j < classes; ++j) row.logits[j] = static_cast<float>(top - 17.0 - 2.0 * u[j]);
  row.logits[target] = static_cast<float>(top);
  if (runner_up) row.logits[(target + 1) % classes] = static_cast<float>(top + 3.0);
  return row;
}

struct Reference {
  double loss;
  std::vector<double> grad;  // softmax - onehot(target)
};

// Float64 on the row's float32 values, the max's own term kept out of the sum.
Reference reference(const Row& row) {
  const auto n = static_cast<int64_t>(row.logits.size());
  const int64_t at = std::max_element(row.logits.begin(), row.logits.end()) - row.logits.begin();
  const double m = row.logits[at];
  double rest = 0;
  for (int64_t j = 0; j < n; ++j)
    if (j != at) rest += std::exp(row.logits[j] - m);
  const double log_sum = std::log1p(rest);
  Reference ref{(m - row.logits[row.target]) + log_sum, std::vector<double>(static_cast<size_t>(n))};
  for (int64_t j = 0; j < n; ++j) {
    const double z = (row.logits[j] - m) - log_sum;
    ref.grad[j] = j == row.target ? std::expm1(z) : std::exp(z);
  }
  return ref;
}

struct Result {
  double loss;
  std::vector<double> grad;
};

Result run(const Row& row, const Device& device, bool hand_over) {
  const auto n = static_cast<int64_t>(row.logits.size());
  Tensor leaf = from_vector(row.logits, {1, n}, TensorOptions{}.with_dtype(DType::Float32)).to(device);
  leaf.requires_grad_(true);
  Tensor targets = from_vector<int64_t>({row.target}, {1}, TensorOptions{}.with_dtype(DType::Int64)).to(device);
  // mul(leaf, 1) is exact and hands a temporary over, which takes the fused kernel.
  Tensor loss = hand_over ? cross_entropy(mul(leaf, 1.0), targets) : cross_entropy(leaf, targets);
  EXPECT_EQ(loss.grad_fn()->name(), hand_over ? "CrossEntropyFusedBackward" : "CrossEntropyBackward");
  loss.backward();
  return {loss.item(), leaf.grad().to(Device::cpu()).to(DType::Float64).to_vector<double>()};
}

void expect_close_to_reference(const Device& device) {
  // 37 and 1000 classes take the warp-sized rows, 4096 and 50257 the block rows.
  for (int64_t classes : {int64_t{37}, int64_t{1000}, int64_t{4096}, int64_t{50257}}) {
    for (int64_t target : {int64_t{0}, int64_t{1}, classes / 2, classes - 1}) {
      for (bool runner_up : {false, true}) {
        for (bool hand_over : {false, true}) {
          SCOPED_TRACE(device.str() + ", " + std::to_string(classes) + " classes, target " + std::to_string(target) +
                       (runner_up ? ", not the max" : ", the max") + (hand_over ? ", fused" : ", two-pass"));
          const Row row = confident_row(classes, target, 0.37f * static_cast<float>(target % 7), runner_up,
                                        static_cast<uint64_t>(classes + target));
          const Reference ref = reference(row);
          const Result got = run(row, device, hand_over);
          // float32 sums of up to 50257 terms and the SFU's exponentials (2 ulp): a few 1e-6 relative.
          EXPECT_NEAR(got.loss, ref.loss, 2e-5 * ref.loss);
          ASSERT_EQ(got.grad.size(), ref.grad.size());
          EXPECT_NEAR(got.grad[target], ref.grad[target], 2e-5 * std::abs(ref.grad[target]));
          int bad = 0;
          for (size_t j = 0; j < ref.grad.size(); ++j) {
            if (std::abs(got.grad[j] - ref.grad[j]) > 2e-5 * std::abs(ref.grad[j]) + 1e-30 && ++bad <= 3)
              ADD_FAILURE() << "class " << j << ": " << got.grad[j] << " against " << ref.grad[j];
          }
        }
      }
    }
  }
}

// Ordinary logits with every seventh class but the target at -inf: the loss and gradient of the row
// without those classes, and a gradient of exactly 0 for them.
void expect_masked_classes_absent(const Device& device) {
  for (int64_t classes : {int64_t{37}, int64_t{1000}, int64_t{50257}}) {
    for (bool hand_over : {false, true}) {
      SCOPED_TRACE(device.str() + ", " + std::to_string(classes) + " classes" + (hand_over ? ", fused" : ", two-pass"));
      Generator gen(static_cast<uint64_t>(classes));
      const std::vector<double> z = randn({classes}, gen, TensorOptions{}.with_dtype(DType::Float64)).to_vector<double>();
      Row row{std::vector<float>(static_cast<size_t>(classes)), classes / 3};
      for (int64_t j = 0; j < classes; ++j)
        row.logits[j] = j % 7 == 0 && j != row.target ? -INFINITY : static_cast<float>(3 * z[j]);
      double m = -INFINITY, sum = 0;
      for (float v : row.logits) m = std::max(m, static_cast<double>(v));
      for (float v : row.logits) sum += std::exp(v - m);
      const double loss = m + std::log(sum) - row.logits[row.target];
      const Result got = run(row, device, hand_over);
      EXPECT_NEAR(got.loss, loss, 1e-5 * loss);
      for (int64_t j = 0; j < classes; ++j) {
        const double want = std::exp(row.logits[j] - m) / sum - (j == row.target ? 1.0 : 0.0);
        if (row.logits[j] == -INFINITY) {
          ASSERT_EQ(got.grad[j], 0.0) << "class " << j;
        } else {
          ASSERT_NEAR(got.grad[j], want, 1e-5 * std::abs(want) + 1e-12) << "class " << j;
        }
      }
    }
  }
}

TEST(CrossEntropyPrecision, ConfidentRowsKeepTheirDigitsOnTheCpu) { expect_close_to_reference(Device::cpu()); }

TEST(CrossEntropyPrecision, MaskedClassesAreAbsentOnTheCpu) { expect_masked_classes_absent(Device::cpu()); }

TEST(CrossEntropyPrecision, MaskedClassesAreAbsentOnCuda) {
  if (!cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  expect_masked_classes_absent(Device::cuda(0));
}

TEST(CrossEntropyPrecision, ConfidentRowsKeepTheirDigitsOnCuda) {
  if (!cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  expect_close_to_reference(Device::cuda(0));
}

}  // namespace
}  // namespace dpt
