#pragma once
// The optimizer of a sharded step (ZeroOptimizer, GatheredLinearZero): it updates pieces, 1-D ranges of
// the tensors the caller's optimizer groups name (DDP's float32 parameters, or the float32 masters of
// mixed precision under the same names), each with the gradient range this rank owns. Under mixed
// precision the matching range of DDP's bf16 parameter becomes the piece's compute twin and carries the
// gradient (optim/optimizer.h set_compute_twins). Optimizer state then exists for the pieces only.
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/tensor.h"
#include "optim/optimizer.h"

namespace dpt::dist {

// A 1-D view of elements [begin, end) of contiguous `t`, outside autograd.
Tensor flat_range(const Tensor& t, int64_t begin, int64_t end);

class ShardPieces {
 public:
  // Builds the inner optimizer over the pieces, e.g.
  //   [&](std::vector<optim::ParamGroup> g) { return std::make_unique<optim::AdamW>(std::move(g), adam); }
  using Factory = std::function<std::unique_ptr<optim::Optimizer>(std::vector<optim::ParamGroup>)>;

  // `owner` names the caller in error messages.
  ShardPieces(std::string owner, const std::vector<optim::ParamGroup>& groups);

  // Checks that DDP's parameter `name` has a tensor to update shaped like `param`, and marks it covered
  // (a parameter of which this rank owns no element is still covered).
  void cover(const std::string& name, const Tensor& param);
  // Elements [begin, end) of DDP's parameter `param` become a piece whose gradient is `grad` (1-D,
  // end - begin elements); covers `name`. Returns the piece (what optimizer().update() takes).
  Tensor add(const std::string& name, const Tensor& param, int64_t begin, int64_t end, const Tensor& grad);
  bool covers(const std::string& name) const { return covered_.count(name) > 0; }
  // The name of the piece of `name` holding elements [begin, end): "<name>[begin:end]".
  static std::string piece_name(const std::string& name, int64_t begin, int64_t end);
  int64_t elements() const { return elements_; }  // over all pieces

  // After every add: checks that each optimizer parameter was covered and that either every piece has a
  // compute twin or none has, then builds the optimizer.
  std::unique_ptr<optim::Optimizer> make_optimizer(const Factory& make);

 private:
  const Tensor& target(const std::string& name, const Tensor& param);

  std::string owner_;
  std::unordered_map<std::string, std::pair<size_t, Tensor>> target_of_;  // name -> (group, tensor to update)
  std::vector<optim::ParamGroup> piece_groups_;
  NamedTensors twins_;
  std::set<std::string> covered_;
  size_t pieces_ = 0;
  int64_t elements_ = 0;
};

}  // namespace dpt::dist
