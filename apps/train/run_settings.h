#pragma once
// The settings that decide what a run computes: model.*, the data.* keys that define the examples,
// optim.*, schedule.*, training.{precision,batch_size,grad_accum,seed,grad_clip} and the world size.
// A checkpoint records them (key=value lines plus a hash of those lines) so that a resume under other
// settings is caught before any work, naming each key that differs. RunSettings that only change how
// the run is carried out (steps, logging, evaluation, prefetching, checkpointing, the distributed
// exchange) are left out: changing them continues the same computation.
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "config.h"
#include "core/safetensors.h"

namespace dpt::train {

using RunSettings = std::vector<std::pair<std::string, std::string>>;

// The computation settings of `config` on `world_size` processes, in schema order ("world_size" last).
RunSettings computation_settings(const Config& config, int world_size);

// A stable 64-bit FNV-1a hash of the settings' key=value lines, as 16 hex digits.
std::string settings_hash(const RunSettings& settings);

// Stores the settings and their hash in a checkpoint's metadata (train.settings, train.settings_hash).
void record_settings(const RunSettings& settings, SafetensorsMetadata& extra);

// What a resume under `current` changes relative to the checkpoint's metadata, one entry per key:
// "model.mlp.activation: relu -> tanh" ("(absent)" for a key one side lacks). nullopt when the checkpoint
// predates recorded settings; an empty list when nothing differs.
std::optional<std::vector<std::string>> settings_changes(const SafetensorsMetadata& extra, const RunSettings& current);

}  // namespace dpt::train
