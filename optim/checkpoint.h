#pragma once
// Training checkpoints: two safetensors files beside each other,
//   <prefix>.model.safetensors  the weights by parameter name (loads in PyTorch / safetensors as is)
//   <prefix>.optim.safetensors  optimizer state ("step", "exp_avg.<name>", ...) with the training state
//                               (step, RNG seed and offset, user entries) in its __metadata__
// Each file is written atomically. The optimizer file is written first and both carry the step, so a
// crash between the two renames is detected on load (steps differ) instead of resuming a mixture.
// Every tensor's bytes carry a CRC32C (core/safetensors.h), so a changed bit is found on load.
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
  bool checksummed = false;  // both files carried per-tensor checksums, and every one matched
};

void save_checkpoint(const std::string& prefix, const NamedTensors& model_state, const Optimizer* optimizer,
                     const TrainingState& state);
// The same with the optimizer's state given (a sharded optimizer's, assembled: distributed/zero_optimizer.h).
void save_checkpoint(const std::string& prefix, const NamedTensors& model_state, const NamedTensors& optimizer_state,
                     const TrainingState& state);
// Reads and validates both files (format, checksums, step agreement, finite weights and state); errors
// name the file and the problem. What the files' bytes prove wrong throws DamagedFile (core/safetensors.h);
// a file that cannot be read (missing, permissions, I/O error, memory) throws anything else.
Checkpoint load_checkpoint(const std::string& prefix);

}  // namespace dpt::optim
