#pragma once
// The optimizer of a sharded step (ZeroOptimizer, GatheredLinearZero): it updates pieces, 1-D ranges of
// the tensors the caller's optimizer groups name (DDP's float32 parameters, or the float32 masters of
// mixed precision under the same names), each with the gradient range this rank owns. Under mixed
// precision the matching range of DDP's bf16 parameter becomes the piece's compute twin and carries the
// gradient (optim/optimizer.h set_compute_twins). Optimizer state then exists for the pieces only.
//
// It also remembers every piece, so that checkpoints hold whole tensors: the targets (float32 masters)
// and the optimizer state of whole parameters, assembled from every rank's pieces, and a whole state
// cut back into this rank's pieces. A piece is either owned (exactly one rank updates those elements)
// or replicated (every rank updates the same elements alike, e.g. GatheredLinearZero's biases).
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "collectives/process_group.h"
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
  // `replicated`: every rank adds the same piece and updates it alike (see above).
  Tensor add(const std::string& name, const Tensor& param, int64_t begin, int64_t end, const Tensor& grad,
             bool replicated = false);
  bool covers(const std::string& name) const { return covered_.count(name) > 0; }
  // The name of the piece of `name` holding elements [begin, end): "<name>[begin:end]".
  static std::string piece_name(const std::string& name, int64_t begin, int64_t end);
  int64_t elements() const { return elements_; }  // over all pieces

  // After every add: checks that each optimizer parameter was covered and that either every piece has a
  // compute twin or none has, then builds the optimizer.
  std::unique_ptr<optim::Optimizer> make_optimizer(const Factory& make);

  // Collectives over `group` (every rank), after make_optimizer. `params` are DDP's parameters: they fix
  // the names, order and shapes of whole tensors.
  // The targets whole on every rank (nothing to do when they are DDP's own parameters, all-gathered).
  void gather_targets(ProcessGroup& group, const NamedTensors& params);
  // `inner`'s state of whole parameters, "<state>.<param>" plus "step": what a plain optimizer over the
  // same groups holds.
  NamedTensors full_state_dict(const optim::Optimizer& inner, ProcessGroup& group, const NamedTensors& params);
  // Local: this rank's pieces of such a state loaded into `inner`; errors name the first entry missing or
  // misshapen.
  void load_full_state_dict(optim::Optimizer& inner, const NamedTensors& full) const;

 private:
  struct Piece {
    std::string param;   // DDP's parameter name
    int64_t begin, end;  // elements of the parameter
    bool replicated;
  };
  const Tensor& target(const std::string& name, const Tensor& param);
  // Whole float32 tensors shaped like `params` from every rank's pieces: `local(piece)` gives this rank's
  // values of that piece (float32, piece-sized). Each owned element comes from its one rank and a replicated
  // one from rank 0, every other rank adding zeros, so the sum over ranks is exact.
  NamedTensors assemble(ProcessGroup& group, const NamedTensors& params,
                        const std::function<Tensor(const Piece&)>& local) const;

  std::string owner_;
  std::unordered_map<std::string, std::pair<size_t, Tensor>> target_of_;  // name -> (group, tensor to update)
  std::vector<optim::ParamGroup> piece_groups_;
  NamedTensors twins_;
  std::set<std::string> covered_;
  std::vector<Piece> pieces_of_rank_;  // every piece added, in order
  int64_t elements_ = 0;
};

}  // namespace dpt::dist
