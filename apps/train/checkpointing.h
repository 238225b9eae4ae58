#pragma once
// The run directory's checkpoints: <dir>/step_00000200/checkpoint.{model,optim}.safetensors
// (optim/checkpoint.h's pair of files), beside <dir>/config.yaml and <dir>/metrics.jsonl.
//
// Atomicity: a checkpoint is written into a temporary directory <dir>/step_N.tmp-<pid>, then renamed
// into place, so <dir>/step_N either holds a complete checkpoint or does not exist. load validates both
// files (format, checksums, sizes, matching steps, the step its name says), so a damaged checkpoint is
// skipped when resuming, never used.
//
// Damaged versus unreadable: a checkpoint counts as damaged only when its own bytes prove it (bad header,
// bad checksum, wrong sizes, non-finite values, a step other than its name's, a file missing from its
// directory). A checkpoint that cannot be read (permissions, an I/O error, out of memory, a FIFO or a
// directory where a file belongs) stops the run: resuming from an older one would silently throw away
// the newer one's progress.
//
// Nothing newer than the step a run resumed from is ever deleted: such checkpoints (damaged ones passed
// over, or an abandoned future under checkpoint.resume never or <path>) are renamed aside to
// step_N.set-aside-<pid>, out of the way of later resumes, for the user to inspect or delete.
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

// Step directories in `dir`, ascending by step (temporary and unrelated entries are ignored). A name
// step_<digits> whose number does not fit 64 bits is passed over and reported through `ignored`.
std::vector<CheckpointEntry> list_checkpoints(const std::string& dir, std::vector<std::string>* ignored = nullptr);

// The step directory for `step` in `dir`.
std::string checkpoint_path(const std::string& dir, int64_t step);

// Writes a checkpoint for state.step atomically, sets aside (never deletes) any checkpoint of the same
// step or newer that is already there, then deletes all but the newest `keep` of the older ones.
// Returns the step directory.
std::string save_run_checkpoint(const std::string& dir, const NamedTensors& model_state,
                                const NamedTensors& optimizer_state, const optim::TrainingState& state, int64_t keep);

// Loads a checkpoint given as a step directory, its "checkpoint" prefix, or one of its two files.
// Throws DamagedFile when the files prove it damaged (for a step directory: also when a file is
// missing from it), anything else when they cannot be read.
optim::Checkpoint load_run_checkpoint(const std::string& path);

// The newest checkpoint in `dir` that loads and validates; damaged ones are reported through `skipped`
// (one line each) and passed over, names that are not checkpoints through `ignored`. nullopt when there
// is none. A checkpoint that cannot be read throws, naming it: the run must not fall back past it.
struct FoundCheckpoint {
  CheckpointEntry entry;
  optim::Checkpoint checkpoint;
};
std::optional<FoundCheckpoint> find_newest_valid(const std::string& dir, std::vector<std::string>* skipped,
                                                 std::vector<std::string>* ignored = nullptr);

// Renames every checkpoint in `dir` newer than `step` (the step this run continues from) to
// step_N.set-aside-<pid>. Returns one line per checkpoint moved ("<from> -> <to>").
std::vector<std::string> set_aside_newer(const std::string& dir, int64_t step);

// Removes the temporary directories (step_N.tmp-<pid>) that processes no longer alive left behind
// (a crash mid-save); a live process's are left alone. Returns one line per directory removed.
std::vector<std::string> clean_leftovers(const std::string& dir);

// Why `checkpoint` cannot continue this run, or "" when it can: a parameter missing, extra, or of
// another shape or dtype than `model_state` (the model about to be trained), or another world size.
std::string incompatibility(const optim::Checkpoint& checkpoint, const NamedTensors& model_state, int world_size);

// Reads an integer "train.*" entry of the checkpoint's metadata; throws naming it when absent or malformed.
int64_t extra_int(const optim::Checkpoint& checkpoint, const std::string& key);
// The same for a number written with fmt's shortest form ("inf" included).
double extra_double(const optim::Checkpoint& checkpoint, const std::string& key);

}  // namespace dpt::train
