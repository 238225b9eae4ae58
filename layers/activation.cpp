#include "layers/activation.h"

#include "core/error.h"
#include "core/ops.h"

namespace dpt::nn {

Tensor ReLU::forward(const Tensor& x) { return relu(x); }
Tensor GELU::forward(const Tensor& x) { return gelu(x); }
Tensor Tanh::forward(const Tensor& x) { return tanh(x); }

std::shared_ptr<Module> make_activation(const std::string& name) {
  if (name == "relu") return std::make_shared<ReLU>();
  if (name == "gelu") return std::make_shared<GELU>();
  if (name == "tanh") return std::make_shared<Tanh>();
  DPT_FAIL("unknown activation '{}' (expected relu, gelu or tanh)", name);
}

}  // namespace dpt::nn
