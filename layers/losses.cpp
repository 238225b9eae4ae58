#include "layers/losses.h"

#include <utility>

#include "core/error.h"
#include "core/ops.h"

namespace dpt::nn {

namespace {
void check_targets(const Tensor& logits, const Tensor& targets) {
  DPT_CHECK(logits.dim() >= 1, "cross_entropy_loss: logits must have a class dimension");
  Shape expected(logits.shape().begin(), logits.shape().end() - 1);
  DPT_CHECK(targets.shape() == expected, "cross_entropy_loss: logits {} need targets {}, found {}",
            shape_str(logits.shape()), shape_str(expected), shape_str(targets.shape()));
}
}  // namespace

Tensor cross_entropy_loss(const Tensor& logits, const Tensor& targets, int64_t ignore_index) {
  check_targets(logits, targets);
  const Tensor rows = logits.reshape({-1, logits.size(-1)});
  return cross_entropy(rows, targets.reshape({-1}), ignore_index);
}

Tensor cross_entropy_loss(Tensor&& logits, const Tensor& targets, int64_t ignore_index) {
  check_targets(logits, targets);
  Tensor rows = logits.reshape({-1, logits.size(-1)});
  logits = Tensor();  // handed over: the [N, C] view becomes the buffer's only handle
  return cross_entropy(std::move(rows), targets.reshape({-1}), ignore_index);
}

Tensor mse(const Tensor& prediction, const Tensor& target) {
  DPT_CHECK(prediction.shape() == target.shape(), "mse: prediction {} and target {} differ in shape",
            shape_str(prediction.shape()), shape_str(target.shape()));
  return dpt::mse_loss(prediction, target);
}

}  // namespace dpt::nn
