// A resume checks the checkpoint's computation settings (apps/train/run_settings.h): a changed model,
// data, optimizer, schedule, precision, batch or seed setting is refused naming each key (old -> new)
// with nothing written, unless checkpoint.resume_changed is allow; other keys (training.steps) resume
// as before, and checkpoints written before settings were recorded resume with a warning.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "optim/checkpoint.h"
#include "train_test_util.h"

namespace dpt::train {
namespace {

namespace fs = std::filesystem;
using namespace test_util;

std::vector<std::string> tiny_mlp(const ScratchDir& dir, int steps) {
  return {"training.device=cpu",
          "model.mlp.hidden=[8]",
          "training.steps=" + std::to_string(steps),
          "schedule.warmup_steps=1",
          "logging.every=1",
          "data.num_samples=128",
          "training.batch_size=16",
          "checkpoint.dir=" + dir.file("run")};
}

std::vector<std::string> with(std::vector<std::string> args, const std::vector<std::string>& more) {
  args.insert(args.end(), more.begin(), more.end());
  return args;
}

int64_t last_train_step(const ScratchDir& dir) {
  const auto records = train_records(read_metrics(dir.file("run/metrics.jsonl")));
  return records.empty() ? -1 : records.back().step;
}

TEST(TrainResumeSettings, AChangedActivationIsRefusedNamingTheKeyAndNothingIsWritten) {
  ScratchDir dir("settings.refused");
  ASSERT_EQ(train(config_path("mlp_synthetic.yaml"), tiny_mlp(dir, 4)).exit_code, 0);
  const auto before = snapshot(dir.file("run"));
  RunResult r = train(config_path("mlp_synthetic.yaml"), with(tiny_mlp(dir, 6), {"model.mlp.activation=tanh"}));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("model.mlp.activation: relu -> tanh"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("checkpoint.resume_changed=allow"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("training.steps"), std::string::npos) << "steps do not change the computation\n" << r.output;
  EXPECT_EQ(snapshot(dir.file("run")), before) << "a refused resume changed the run directory";
}

TEST(TrainResumeSettings, EachChangedKeyIsListedWithItsOldAndNewValue) {
  ScratchDir dir("settings.several");
  ASSERT_EQ(train(config_path("mlp_synthetic.yaml"),
                  with(tiny_mlp(dir, 4), {"optim.lr=0.01", "training.seed=0", "data.noise=0.2"}))
                .exit_code,
            0);
  RunResult r = train(config_path("mlp_synthetic.yaml"),
                      with(tiny_mlp(dir, 6), {"optim.lr=0.002", "training.seed=7", "data.noise=0.5"}));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  for (const char* line : {"data.noise: 0.2 -> 0.5", "training.seed: 0 -> 7", "optim.lr: 0.01 -> 0.002"})
    EXPECT_NE(r.output.find(line), std::string::npos) << line << "\n" << r.output;
}

TEST(TrainResumeSettings, ResumeChangedAllowWarnsAndContinues) {
  ScratchDir dir("settings.allowed");
  ASSERT_EQ(train(config_path("mlp_synthetic.yaml"), tiny_mlp(dir, 4)).exit_code, 0);
  RunResult r = train(config_path("mlp_synthetic.yaml"),
                      with(tiny_mlp(dir, 6), {"model.mlp.activation=tanh", "checkpoint.resume_changed=allow"}));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("model.mlp.activation: relu -> tanh"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("at step 4"), std::string::npos) << r.output;
  EXPECT_EQ(last_train_step(dir), 6);
}

TEST(TrainResumeSettings, MoreStepsResumeWithoutComplaint) {
  ScratchDir dir("settings.steps");
  ASSERT_EQ(train(config_path("mlp_synthetic.yaml"), tiny_mlp(dir, 4)).exit_code, 0);
  RunResult r = train(config_path("mlp_synthetic.yaml"), with(tiny_mlp(dir, 6), {"eval.batches=2"}));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("resuming from"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("other settings"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("differ"), std::string::npos) << r.output;
  EXPECT_EQ(last_train_step(dir), 6);
}

// Input paths count by the file they reach: a run started from the source tree (data.path relative to
// it) resumes from another working directory, where the same path resolves beside the config.
TEST(TrainResumeSettings, TheSameDataFileReachedFromAnotherDirectoryIsNoChange) {
  ScratchDir dir("settings.cwd");
  const std::vector<std::string> gpt = {"training.device=cpu",     "model.gpt.n_layer=1",
                                        "model.gpt.n_head=2",      "model.gpt.n_embd=16",
                                        "data.seq_len=16",         "training.batch_size=8",
                                        "eval.batches=1",          "eval.sample_tokens=0",
                                        "schedule.warmup_steps=1", "checkpoint.dir=" + dir.file("run")};
  const std::string from_source = "cd " + quote(DPT_SOURCE_DIR) + " && " +
                                  train_command("configs/char_gpt.yaml", with(gpt, {"training.steps=2"}), 1);
  ASSERT_EQ(run_shell(from_source).exit_code, 0);
  const std::string from_elsewhere = "cd " + quote(dir.path().string()) + " && " +
                                     train_command(config_path("char_gpt.yaml"), with(gpt, {"training.steps=4"}), 1);
  RunResult r = run_shell(from_elsewhere);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("at step 2"), std::string::npos) << r.output;
  EXPECT_EQ(last_train_step(dir), 4);
}

// A checkpoint of an older dptrain (its metadata without train.settings*) resumes with a warning.
TEST(TrainResumeSettings, CheckpointsWithoutRecordedSettingsResumeWithAWarning) {
  ScratchDir dir("settings.old");
  ASSERT_EQ(train(config_path("mlp_synthetic.yaml"), tiny_mlp(dir, 4)).exit_code, 0);
  const std::string prefix = dir.file("run/step_00000004/checkpoint");
  optim::Checkpoint old = optim::load_checkpoint(prefix);
  ASSERT_EQ(old.state.extra.erase("train.settings"), 1u);
  ASSERT_EQ(old.state.extra.erase("train.settings_hash"), 1u);
  optim::save_checkpoint(prefix, old.model, old.optimizer, old.state);
  RunResult r = train(config_path("mlp_synthetic.yaml"), with(tiny_mlp(dir, 6), {"model.mlp.activation=tanh"}));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("does not record its settings"), std::string::npos) << r.output;
  EXPECT_EQ(last_train_step(dir), 6);
}

}  // namespace
}  // namespace dpt::train
