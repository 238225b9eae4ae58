#pragma once
// dpt-train --multirun (Hydra's spelling): every override whose value lists several choices
// (`optim.lr=0.01,0.003`) is a sweep dimension; dpt-train runs every combination, one after another,
// each as a child dpt-train with its own checkpoint.dir, <checkpoint.dir>/multirun/<key>_<value>__...
// (and its metrics.jsonl there), then reads each run's metrics.jsonl and writes summary.md and
// summary.csv into the multirun directory: the combination, the final and best validation loss, and
// the median throughput.
#include <string>
#include <vector>

namespace dpt::train {

// One override "key=a,b,c" as its key and choices. Commas inside [...], {...} or quotes belong to the
// value (`model.mlp.hidden=[64,64]` is one choice).
struct SweepDimension {
  std::string key;  // as written, with any leading + or ++
  std::vector<std::string> choices;
};

SweepDimension parse_sweep(const std::string& override_text);

// Every combination, in order (the last dimension varies fastest), as override lists.
std::vector<std::vector<std::string>> sweep_combinations(const std::vector<SweepDimension>& dimensions);

// "optim.lr_0.01__training.batch_size_32": a run's directory name, only [A-Za-z0-9._+-] and '_'.
std::string run_name(const std::vector<std::string>& combination);

struct RunSummary {
  std::string name;
  std::vector<std::string> combination;
  int exit_code = 0;
  double final_val_loss = 0;  // NaN when the run wrote no evaluation
  double best_val_loss = 0;   // NaN likewise
  double throughput = 0;      // median over the run's steps; NaN when it wrote none
  std::string unit;
};

// The summary of a run from its metrics file; throws naming the file when it cannot be read or a line
// is not JSON.
RunSummary summarize_run(const std::string& metrics_file);

// Runs every combination of `overrides` (fixed ones and sweeps) of `config_path` with `program` (this
// dpt-train), writes the summaries, and returns 0 when every run succeeded, else 1.
int multirun(const std::string& program, const std::string& config_path, const std::vector<std::string>& overrides);

}  // namespace dpt::train
