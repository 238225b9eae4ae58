#pragma once
// Linear: y = x W^T + b, with W stored [out_features, in_features] as in PyTorch, so weights load by
// name into torch.nn.Linear. x may have any leading dims: [..., in] -> [..., out].
#include <functional>

#include "core/ops.h"
#include "layers/module.h"

namespace dpt::nn {

class Linear : public Module {
 public:
  // W and b ~ U(-1/sqrt(in), 1/sqrt(in)), PyTorch's default.
  Linear(int64_t in_features, int64_t out_features, bool bias = true, Generator& gen = default_generator());
  Tensor forward(const Tensor& x) override;
  // act(x W^T + b) in one op (dpt::linear): on CUDA the activation runs in the GEMM's epilogue, and a
  // Linear fed directly by this output fuses the activation's backward into its own (core/ops_linear.cpp).
  Tensor forward_with(const Tensor& x, Activation act);
  // residual + forward(x), the add inside the GEMM on CUDA (dpt::linear_residual).
  Tensor forward_residual(const Tensor& x, const Tensor& residual);

  Tensor weight;
  Tensor bias;  // undefined without bias
  // What forms act(x W^T + b) in forward_with and forward_residual: dpt::linear when empty. A component that
  // forms this layer's weight and bias gradients itself installs its own op here (as
  // distributed/gathered_linear_zero.h does) and empties it again when it ends.
  std::function<Tensor(const Tensor& x, Activation act)> op;
};

}  // namespace dpt::nn
