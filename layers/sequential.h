#pragma once
// Sequential: children "0", "1", ... applied in order. Also the container for repeated blocks
// (GPT's "blocks.3...").
#include <memory>
#include <vector>

#include "layers/module.h"

namespace dpt::nn {

class Sequential : public Module {
 public:
  Sequential() = default;
  explicit Sequential(std::vector<std::shared_ptr<Module>> modules);
  void push_back(std::shared_ptr<Module> module);  // registered under the next index
  Tensor forward(const Tensor& x) override;
  size_t size() const { return modules_.size(); }
  Module& operator[](size_t i) const { return *modules_.at(i); }

 private:
  std::vector<std::shared_ptr<Module>> modules_;
};

}  // namespace dpt::nn
