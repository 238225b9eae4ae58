#pragma once
// Training checkpoints: two safetensors files beside each other,
//   <prefix>.model.safetensors  the weights by parameter name (loads in PyTorch / safetensors as is)
//   <prefix>.optim.safetensors  optimizer state ("step", "exp_avg.<name>", ...) with the training state
//                               (step, RNG seed and offset, user entries) in its __metadata__
// Each file is written atomically. The optimizer file is written first and both carry the step, so a
// crash between the two renames is detected on load (steps differ) instead of resuming a mixture.
// Under MixedPrecision, save the float32 masters as the model state.
#include <string>

#include "core/safetensors.h"
#include "optim/optimizer.h"

namespace dpt::optim {

struct TrainingState {
  int64_t step = 0;
  uint64_t rng_seed = 0;
  uint64_t rng_offset = 0;
  SafetensorsMetadata extra;  // e.g. data-loader position; keys must not start with "dpt."
};

struct Checkpoint {
  NamedTensors model;      // CPU tensors; pass to Module::load_state_dict
  NamedTensors optimizer;  // pass to Optimizer::load_state_dict (empty when saved without one)
  TrainingState state;
};

void save_checkpoint(const std::string& prefix, const NamedTensors& model_state, const Optimizer* optimizer,
                     const TrainingState& state);
// The same with the optimizer's state given (a sharded optimizer's, assembled: distributed/zero_optimizer.h).
void save_checkpoint(const std::string& prefix, const NamedTensors& model_state, const NamedTensors& optimizer_state,
                     const TrainingState& state);
// Reads and validates both files (format, step agreement); errors name the file and the problem.
Checkpoint load_checkpoint(const std::string& prefix);

}  // namespace dpt::optim
