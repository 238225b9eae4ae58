#pragma once
// MLP: Linear layers of the given widths with an activation between them (none after the last).
// sizes {2, 64, 64, 3}: 2 inputs, two hidden layers of 64, 3 outputs. Children "0", "1", ... as in a
// PyTorch nn.Sequential of the same layers, so weights load there by name.
#include <string>
#include <vector>

#include "layers/sequential.h"

namespace dpt::nn {

class MLP : public Sequential {
 public:
  MLP(const std::vector<int64_t>& sizes, const std::string& activation = "relu",
      Generator& gen = default_generator());
  // As Sequential, except that a Linear followed by a ReLU or GELU module runs as one fused op
  // (Linear::forward_with): same parameters and names, same CPU results.
  Tensor forward(const Tensor& x) override;
};

}  // namespace dpt::nn
