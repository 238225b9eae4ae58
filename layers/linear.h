#pragma once
// Linear: y = x W^T + b, with W stored [out_features, in_features] as in PyTorch, so weights load by
// name into torch.nn.Linear. x may have any leading dims: [..., in] -> [..., out].
#include "layers/module.h"

namespace dpt::nn {

class Linear : public Module {
 public:
  // W and b ~ U(-1/sqrt(in), 1/sqrt(in)), PyTorch's default.
  Linear(int64_t in_features, int64_t out_features, bool bias = true, Generator& gen = default_generator());
  Tensor forward(const Tensor& x) override;

  Tensor weight;
  Tensor bias;  // undefined without bias
};

}  // namespace dpt::nn
