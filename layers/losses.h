#pragma once
// Loss wrappers over the fused ops, accepting any leading shape.
#include "core/tensor.h"

namespace dpt::nn {

// logits [..., C], targets [...] (int32/int64) -> mean over targets != ignore_index of
// -log softmax(logits)[target]. float32 result for bfloat16 logits.
Tensor cross_entropy_loss(const Tensor& logits, const Tensor& targets, int64_t ignore_index = -100);
// Logits handed over (a temporary or std::move'd) may become their own gradient in the forward pass
// (dpt::cross_entropy(Tensor&&)): the usual `cross_entropy_loss(model.forward(x), y)` takes this one.
Tensor cross_entropy_loss(Tensor&& logits, const Tensor& targets, int64_t ignore_index = -100);
// mean((prediction - target)^2) over all elements; shapes must match (no broadcasting, unlike
// dpt::mse_loss, so a [N] vs [N, 1] mistake fails loudly).
Tensor mse(const Tensor& prediction, const Tensor& target);

}  // namespace dpt::nn
