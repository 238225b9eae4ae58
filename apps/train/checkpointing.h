#pragma once
// The run directory's checkpoints: <dir>/step_00000200/checkpoint.{model,optim}.safetensors
// (optim/checkpoint.h's pair of files), beside <dir>/config.yaml and <dir>/metrics.jsonl.
//
// Atomicity: a checkpoint is written into a temporary directory <dir>/step_N.tmp-<pid>, then renamed
// into place, so <dir>/step_N either holds a complete checkpoint or does not exist. load validates both
// files (format, sizes, matching steps), so a damaged checkpoint is skipped when resuming, never used.
//
// What the trainer stores besides weights and optimizer state (TrainingState::extra, "train.*" keys):
// the world size, the loader position, the number of skipped steps, the model's description and the
// batch layout, so that a resume can refuse a checkpoint of a different model or world size.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/safetensors.h"
#include "optim/checkpoint.h"

namespace dpt::train {

struct CheckpointEntry {
  int64_t step = 0;
  std::string path;  // the step directory
};

// Step directories in `dir`, ascending by step (temporary and unrelated entries are ignored).
std::vector<CheckpointEntry> list_checkpoints(const std::string& dir);

// The step directory for `step` in `dir`.
std::string checkpoint_path(const std::string& dir, int64_t step);

// Writes a checkpoint for state.step atomically (replacing an older one of the same step), then
// removes every checkpoint newer than it (a stale future of an earlier run) and all but the newest
// `keep`. Returns the step directory.
std::string save_run_checkpoint(const std::string& dir, const NamedTensors& model_state,
                                const NamedTensors& optimizer_state, const optim::TrainingState& state, int64_t keep);

// Loads a checkpoint given as a step directory, its "checkpoint" prefix, or one of its two files.
optim::Checkpoint load_run_checkpoint(const std::string& path);

// The newest checkpoint in `dir` that loads and validates; damaged ones are reported through
// `skipped` (one line each) and passed over. nullopt when there is none.
struct FoundCheckpoint {
  CheckpointEntry entry;
  optim::Checkpoint checkpoint;
};
std::optional<FoundCheckpoint> find_newest_valid(const std::string& dir, std::vector<std::string>* skipped);

// Why `checkpoint` cannot continue this run, or "" when it can: a parameter missing, extra, or of
// another shape or dtype than `model_state` (the model about to be trained), or another world size.
std::string incompatibility(const optim::Checkpoint& checkpoint, const NamedTensors& model_state, int world_size);

// Reads an integer "train.*" entry of the checkpoint's metadata; throws naming it when absent or malformed.
int64_t extra_int(const optim::Checkpoint& checkpoint, const std::string& key);

}  // namespace dpt::train
