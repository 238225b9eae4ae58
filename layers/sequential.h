#pragma once
// Sequential: children "0", "1", ... applied in order. Also the container for repeated blocks
// (GPT's "blocks.3...").
#include <functional>
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

  // Called with i just before child i runs in forward() (null: none). What it is for: a sharded optimizer
  // whose parameter all-gathers are still running makes the current stream wait there for child i's
  // parameters only, so the gathers of later children run beside the forward of earlier ones
  // (distributed/zero_optimizer.h). Subclasses that override forward() do not call it.
  void set_before_child(std::function<void(size_t)> hook) { before_child_ = std::move(hook); }

 private:
  std::vector<std::shared_ptr<Module>> modules_;
  std::function<void(size_t)> before_child_;
};

}  // namespace dpt::nn
