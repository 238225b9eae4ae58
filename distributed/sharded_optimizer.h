#pragma once
// What a training loop needs of an optimizer whose state and update are sharded across ranks and which
// it steps itself after backward, as it would a plain optimizer: ZeroOptimizer and GatheredLinearZero,
// each with UpdateTiming::OnStep. The trainer (apps/train) holds either through this interface.
#include "core/safetensors.h"
#include "optim/optimizer.h"

namespace dpt::dist {

class ShardedOptimizer {
 public:
  virtual ~ShardedOptimizer() = default;

  // The inner optimizer over this rank's pieces: learning rate, this rank's state.
  virtual optim::Optimizer& optimizer() = 0;
  // After backward, on every rank: the global norm of the averaged gradients (every rank's share
  // counted once); above max_norm (> 0) they are scaled by max_norm / (norm + 1e-6) as
  // optim::clip_grad_norm does. A non-finite norm is returned and nothing is scaled.
  virtual double clip_grad_norm(double max_norm) = 0;
  // On every rank: the update of this rank's pieces and the all-gathers; on return (CUDA: on the compute
  // stream) the parameters hold the step's values.
  virtual void step() = 0;

  // Collective: the targets (float32 masters) whole on every rank.
  virtual void gather_targets() = 0;
  // Collective: the optimizer state of whole parameters, "<state>.<param>" plus "step", on every rank:
  // the names and shapes a plain optimizer over the same groups has.
  virtual NamedTensors full_state_dict() = 0;
  // Local: this rank's shard of such a state (from full_state_dict() or a plain optimizer); errors name
  // the first entry missing or misshapen.
  virtual void load_full_state_dict(const NamedTensors& full) = 0;
};

}  // namespace dpt::dist
