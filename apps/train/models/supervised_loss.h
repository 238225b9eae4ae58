#pragma once
// The loss of the models that map an example's features to class logits or to regression outputs.
#include "components.h"
#include "layers/losses.h"

namespace dpt::train {

// Mean squared error for regression targets (in float32), else cross-entropy against class ids.
inline Tensor supervised_loss(Tensor out, const Tensor& target, bool regression) {
  if (regression) return nn::mse(out.to(DType::Float32), target);
  return nn::cross_entropy_loss(std::move(out), target);
}

// ModelParts::loss of a model whose forward takes a batch's inputs as they come, in the compute dtype.
inline ModelLoss forward_supervised_loss(bool regression) {
  return [regression](nn::Module& m, const data::Batch& batch, DType compute) {
    return supervised_loss(m.forward(batch.input.to(compute)), batch.target, regression);
  };
}

}  // namespace dpt::train
