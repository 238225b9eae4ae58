#include "layers/sequential.h"

#include <string>

namespace dpt::nn {

Sequential::Sequential(std::vector<std::shared_ptr<Module>> modules) {
  for (auto& m : modules) push_back(std::move(m));
}

void Sequential::push_back(std::shared_ptr<Module> module) {
  modules_.push_back(register_module(std::to_string(modules_.size()), std::move(module)));
}

Tensor Sequential::forward(const Tensor& x) {
  Tensor h = x;
  for (size_t i = 0; i < modules_.size(); ++i) {
    if (before_child_) before_child_(i);
    h = modules_[i]->forward(h);
  }
  return h;
}

}  // namespace dpt::nn
