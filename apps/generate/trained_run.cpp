#include "trained_run.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <filesystem>

#include "checkpointing.h"
#include "core/cuda_runtime.h"
#include "core/error.h"

namespace dpt::train {

namespace fs = std::filesystem;

namespace {

// The step directory to load: the chosen step, or the newest one that loads.
FoundCheckpoint pick_checkpoint(const std::string& dir, std::optional<int64_t> step) {
  if (step) {
    const std::string path = checkpoint_path(dir, *step);
    if (!fs::is_directory(path)) {
      std::vector<std::string> steps;
      for (const auto& e : list_checkpoints(dir)) steps.push_back(std::to_string(e.step));
      DPT_FAIL("run '{}' has no checkpoint of step {} (it has: {})", dir, *step,
               steps.empty() ? "none" : fmt::format("{}", fmt::join(steps, ", ")));
    }
    return FoundCheckpoint{CheckpointEntry{*step, path}, load_run_checkpoint(path)};
  }
  std::vector<std::string> skipped;
  std::optional<FoundCheckpoint> found = find_newest_valid(dir, &skipped);
  for (const auto& s : skipped) spdlog::warn("skipping a damaged checkpoint: {}", s);
  DPT_CHECK(found.has_value(), "run '{}' holds no {}checkpoint (step_N directories written by dpt-train)", dir,
            skipped.empty() ? "" : "valid ");
  return std::move(*found);
}

const Tensor& checkpoint_tensor(const optim::Checkpoint& checkpoint, const std::string& name,
                                const std::string& where) {
  auto it = std::find_if(checkpoint.model.begin(), checkpoint.model.end(),
                         [&](const auto& entry) { return entry.first == name; });
  DPT_CHECK(it != checkpoint.model.end(), "checkpoint '{}' has no '{}': not a GPT checkpoint", where, name);
  return it->second;
}

}  // namespace

Device choose_device(const std::string& text) {
  if (text == "auto") return cuda::is_available() ? Device::cuda(0) : Device::cpu();
  const Device device = Device::parse(text);
  if (device.is_cuda()) {
    const int count = cuda::is_available() ? cuda::device_count() : 0;
    DPT_CHECK(device.index < count, "--device {}: {} GPU(s) visible{}", text, count,
              count == 0 ? " (none, or a build without CUDA); use --device cpu" : "");
  }
  return device;
}

std::unique_ptr<TrainedRun> open_trained_run(const std::string& path, std::optional<int64_t> step, Device device) {
  auto run = std::make_unique<TrainedRun>();
  DPT_CHECK(fs::exists(path), "'{}' does not exist: expected a dpt-train run directory (its checkpoint.dir)", path);
  // A step directory names its run as its parent.
  const bool is_step_dir = fs::exists(fs::path(path) / "checkpoint.model.safetensors");
  DPT_CHECK(!(is_step_dir && step),
            "--step {} chooses among the checkpoints of a run directory; '{}' is one checkpoint", *step, path);
  run->dir = is_step_dir ? fs::path(path).parent_path().string() : path;
  const std::string config_file = (fs::path(run->dir) / "config.yaml").string();
  DPT_CHECK(fs::is_regular_file(config_file),
            "'{}' holds no config.yaml: expected a dpt-train run directory (its checkpoint.dir)", run->dir);
  LoadOptions options;
  options.check_files = false;  // the data is not needed to sample (a char vocabulary may be; see text_codec.h)
  options.check_device = false;
  run->config = load_config(config_file, {}, options);
  DPT_CHECK(run->config.model.kind == "gpt",
            "run '{}' trained a model.kind '{}': only GPT runs can be sampled or exported", run->dir,
            run->config.model.kind);

  FoundCheckpoint found = is_step_dir ? FoundCheckpoint{CheckpointEntry{-1, path}, load_run_checkpoint(path)}
                                      : pick_checkpoint(run->dir, step);
  run->checkpoint_path = found.entry.path;
  run->checkpoint = std::move(found.checkpoint);
  run->step = run->checkpoint.state.step;

  // The vocabulary size was read off the training data; the checkpoint's embedding says what it was.
  DataShape shape;
  shape.tokens = true;
  shape.seq_len = run->config.data.seq_len;
  shape.vocab_size = checkpoint_tensor(run->checkpoint, "wte.weight", run->checkpoint_path).size(0);
  run->model = std::make_unique<Model>(run->config, shape, run->gen);
  const NamedTensors expected = run->model->module()->state_dict();
  const int world = run->checkpoint.state.extra.count("train.world_size")
                        ? static_cast<int>(extra_int(run->checkpoint, "train.world_size"))
                        : 1;
  const std::string why = incompatibility(run->checkpoint, expected, world);
  DPT_CHECK(why.empty(), "checkpoint '{}' does not fit the model of '{}': it is from {}", run->checkpoint_path,
            config_file, why);
  run->model->module()->load_state_dict(run->checkpoint.model);
  run->model->module()->to(device);
  // Only the metadata is needed from here on: the weights are in the model, the optimizer state unused.
  run->checkpoint.model.clear();
  run->checkpoint.optimizer.clear();
  return run;
}

}  // namespace dpt::train
