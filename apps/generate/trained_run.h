#pragma once
// A dpt-train run directory opened for inference: its resolved config.yaml, one checkpoint (the newest
// that loads and validates, or a chosen step), and the GPT that config describes with the checkpoint's
// weights, on the chosen device. The model is built by the trainer's own factory and the checkpoint read
// by its own loader, so whatever dpt-train can resume, this can sample from.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "config.h"
#include "core/device.h"
#include "core/factory.h"
#include "layers/gpt.h"
#include "model_factory.h"
#include "optim/checkpoint.h"

namespace dpt::train {

struct TrainedRun {
  std::string dir;              // the run directory (checkpoint.dir of the run)
  std::string checkpoint_path;  // the step directory loaded
  int64_t step = 0;
  Config config;
  optim::Checkpoint checkpoint;  // its metadata (state); the tensors are dropped once loaded
  Generator gen;                 // declared before the model, which keeps a pointer to it
  std::unique_ptr<Model> model;

  nn::GPT& gpt() const { return static_cast<nn::GPT&>(*model->module()); }
  int64_t vocab_size() const { return gpt().config().vocab_size; }
};

// `path` is a run directory (then `step` picks step_N, else the newest valid checkpoint) or one step
// directory in it. Throws with what is missing or wrong: no config.yaml, no (valid) checkpoint, no such
// step, a run that did not train a GPT, weights that do not fit the config.
std::unique_ptr<TrainedRun> open_trained_run(const std::string& path, std::optional<int64_t> step, Device device);

// "auto" (the first GPU when there is one, else the CPU), "cpu", "cuda" or "cuda:N"; throws when a GPU is
// asked for and there is none of that index.
Device choose_device(const std::string& text);

}  // namespace dpt::train
