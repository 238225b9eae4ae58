// Lookups and losses: embedding, fused cross-entropy, mean squared error.
#include <memory>

#include "core/autograd.h"
#include "core/error.h"
#include "core/factory.h"
#include "core/kernels.h"
#include "core/op_helpers.h"
#include "core/ops.h"

namespace dpt {

namespace {

void check_indices(const char* op, const Tensor& indices, const Tensor& like) {
  DPT_CHECK(indices.defined(), "{}: undefined index tensor", op);
  DPT_CHECK(indices.dtype() == DType::Int32 || indices.dtype() == DType::Int64,
            "{}: expected int32 or int64 indices, found {} of shape {}", op, dtype_name(indices.dtype()),
            shape_str(indices.shape()));
  DPT_CHECK(indices.device() == like.device(), "{}: indices on {} but data on {}", op, indices.device().str(),
            like.device().str());
}

// Number of targets != ignore_index, as a 0-d tensor of `dtype`, computed on the targets' device (no
// host sync): with d = target - ignore_index (an integer, exact in float64), |d| = sqrt(d * d) and the
// row is ignored exactly when relu(1 - |d|) = 1.
Tensor count_targets(const Tensor& targets, int64_t ignore_index, DType dtype) {
  Tensor d = add(targets.detach().to(DType::Float64), -static_cast<double>(ignore_index));
  Tensor ignored = relu(add(neg(sqrt(mul(d, d))), 1.0));
  return add(neg(sum(ignored)), static_cast<double>(targets.numel())).to(dtype);
}

// True when `x` is the only handle on its memory: nobody else can observe the logits being overwritten.
// The usual `cross_entropy(model(x), y)` leaves the saved copy as the last one by the time backward runs.
bool sole_owner(const Tensor& x) {
  return x.impl_ptr().use_count() == 1 && x.impl()->storage.use_count() == 1;
}

}  // namespace

Tensor embedding(const Tensor& weight, const Tensor& indices) {
  detail::check_floating("embedding", weight);
  DPT_CHECK(weight.dim() == 2, "embedding: expected a weight of shape [num, dim], found {}", shape_str(weight.shape()));
  check_indices("embedding", indices, weight);
  Shape out_shape = indices.shape();
  out_shape.push_back(weight.size(1));
  Tensor out = detail::empty_as(weight, out_shape);
  Tensor idx = detail::contiguous_data(indices.detach());
  kernels::embedding(detail::contiguous_data(weight.detach()), idx, out);
  Shape weight_shape = weight.shape();
  record_op("EmbeddingBackward", {weight}, {out}, [idx, weight_shape](const std::vector<Tensor>& g) {
    Tensor gw = zeros(weight_shape, g[0].options());
    kernels::embedding_backward(detail::contiguous_data(g[0]), idx, gw);
    return std::vector<Tensor>{gw};
  });
  return out;
}

namespace {

void check_cross_entropy(const Tensor& logits, const Tensor& targets) {
  detail::check_floating("cross_entropy", logits);
  DPT_CHECK(logits.dim() == 2, "cross_entropy: expected logits [N, C], found {}", shape_str(logits.shape()));
  check_indices("cross_entropy", targets, logits);
  DPT_CHECK(targets.dim() == 1 && targets.size(0) == logits.size(0),
            "cross_entropy: expected targets [{}] for logits {}, found {}", logits.size(0), shape_str(logits.shape()),
            shape_str(targets.shape()));
}

// The statistics are kept in float32 whatever the logits' dtype (float64 for float64 logits), so bf16
// training still reports and differentiates a float32 loss.
TensorOptions stat_options(const Tensor& logits) {
  return logits.options().with_dtype(logits.dtype() == DType::Float64 ? DType::Float64 : DType::Float32);
}

// max(count, 1) for the mean over counted rows: count + relu(1 - count) keeps an all-ignored batch at 0.
Tensor mean_denominator(const Tensor& targets, int64_t ignore_index, DType dtype) {
  NoGradGuard no_grad;
  Tensor count = count_targets(targets, ignore_index, dtype);
  return add(count, relu(add(neg(count), 1.0)));
}

Tensor mean_loss(const Tensor& losses, const Tensor& denominator) {
  NoGradGuard no_grad;
  return div(sum(losses), denominator);
}

}  // namespace

// The backward writes softmax(x) - onehot(target) over the logits themselves when no one else holds them:
// each logit is read once, right before its gradient element is written, so the overwrite is safe, and
// the logits and their gradient (GPT-2 at 16 x 1024 tokens: 1.5 GiB each in bf16) never coexist at
// the start of backward, the step's memory peak. Like PyTorch without retain_graph, a second backward
// through that graph is then an error.
Tensor cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index) {
  check_cross_entropy(logits, targets);
  Tensor x = detail::contiguous_data(logits.detach());
  Tensor t = detail::contiguous_data(targets.detach());
  Tensor losses = Tensor::empty({logits.size(0)}, stat_options(logits));
  Tensor lse = Tensor::empty({logits.size(0)}, stat_options(logits));
  kernels::cross_entropy(x, t, ignore_index, losses, lse);
  Tensor denominator = mean_denominator(t, ignore_index, lse.dtype());
  Tensor loss = mean_loss(losses, denominator);
  record_op("CrossEntropyBackward", {logits}, {loss},
            [x, t, ignore_index, lse, denominator](const std::vector<Tensor>& g) {
              Tensor scale = div(g[0].to(lse.dtype()), denominator);
              // This closure is the logits' last holder unless the caller kept them; the engine releases
              // it when this backward returns, so gx is then the buffer's only handle.
              const bool in_place = sole_owner(x);
              Tensor gx = in_place ? x : detail::empty_as(x, x.shape());
              kernels::cross_entropy_backward(x, t, ignore_index, lse, detail::contiguous_data(scale), gx);
              return std::vector<Tensor>{gx};
            });
  return loss;
}

// Logits handed over (a temporary, or std::move'd) and held by nothing else cannot be looked at again, so
// the forward may turn them into their gradient at once: one kernel reads each row for the loss and
// rewrites it as (softmax - onehot) / count while it is still in L2 (llm.c's fused classifier). The
// logits then cross the memory bus twice instead of three times. Backward only multiplies by the
// upstream gradient, which for `loss.backward()` is exactly 1 and costs nothing (checked on the device).
// Without a backward to come, or with other holders, this is the const& overload.
Tensor cross_entropy(Tensor&& logits, const Tensor& targets, int64_t ignore_index) {
  const Tensor& held = logits;
  if (!(grad_mode_enabled() && logits.requires_grad() && logits.is_contiguous() && sole_owner(logits)))
    return cross_entropy(held, targets, ignore_index);
  check_cross_entropy(logits, targets);
  Tensor x = logits.detach();
  Tensor t = detail::contiguous_data(targets.detach());
  Tensor losses = Tensor::empty({logits.size(0)}, stat_options(logits));
  Tensor lse = Tensor::empty({logits.size(0)}, stat_options(logits));
  Tensor denominator = mean_denominator(t, ignore_index, lse.dtype());
  Tensor inverse;
  {
    NoGradGuard no_grad;
    inverse = div(ones_like(denominator), denominator);
  }
  kernels::cross_entropy_with_grad(x, t, ignore_index, inverse, losses, lse, x);
  Tensor loss = mean_loss(losses, denominator);
  record_op("CrossEntropyFusedBackward", {logits}, {loss}, [x, lse](const std::vector<Tensor>& g) {
    // x holds the gradient for an upstream gradient of 1; the engine releases this closure when it
    // returns, leaving gx the buffer's only handle.
    Tensor gx = x;
    kernels::scale_unless_one(gx, detail::contiguous_data(g[0].to(lse.dtype())));
    return std::vector<Tensor>{gx};
  });
  return loss;
}

Tensor mse_loss(const Tensor& prediction, const Tensor& target) {
  detail::check_compatible("mse_loss", prediction, target);
  DPT_CHECK(prediction.shape() == target.shape(), "mse_loss: prediction {} and target {} must have the same shape",
            shape_str(prediction.shape()), shape_str(target.shape()));
  Tensor d = sub(prediction, target);
  return mean(mul(d, d));
}

}  // namespace dpt
