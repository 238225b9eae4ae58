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
  // After backward: this rank's share of the squared norm of the averaged gradients (each element counted
  // on exactly one rank), float64 [1] where the gradients are, enqueued without waiting. Summed over the
  // ranks it is what optim::grad_sum_of_squares gives one process; clipping and skipping go through the
  // inner optimizer's gate (optim::Optimizer::set_gate, optim/step_outcome.h).
  virtual Tensor grad_sum_of_squares() = 0;
  // On every rank, under the inner optimizer's gate: the update of this rank's pieces and the all-gathers.
  // A gate read on the host that skips the step leaves everything as it was.
  virtual void step() = 0;
  // The current stream (Gloo: the host) waits until the parameters hold the last step's values. On CUDA
  // step() returns with its all-gathers still running, and the model's forward waits for each layer's
  // parameters where it first reads them (zero_optimizer.h, gathered_linear_zero.h): only other readers call
  // this.
  virtual void wait_for_parameters() {}

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
