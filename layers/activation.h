#pragma once
// Parameter-free activation modules, for Sequential.
#include <memory>
#include <string>

#include "layers/module.h"

namespace dpt::nn {

class ReLU : public Module {
 public:
  Tensor forward(const Tensor& x) override;
};

// GELU, tanh approximation (GPT-2's).
class GELU : public Module {
 public:
  Tensor forward(const Tensor& x) override;
};

class Tanh : public Module {
 public:
  Tensor forward(const Tensor& x) override;
};

// "relu", "gelu" or "tanh"; throws naming the choices otherwise.
std::shared_ptr<Module> make_activation(const std::string& name);

}  // namespace dpt::nn
