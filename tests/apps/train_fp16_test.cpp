// dpt-train with training.precision fp16 on the CPU: float16 compute, float32 masters and dynamic loss
// scaling. The run follows the float32 run's losses within float16 rounding, logs its loss scale in
// every metrics record and in the log line, and a resumed run continues with the checkpointed scale,
// reproducing the uninterrupted losses exactly.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "train_test_util.h"

namespace dpt::train {
namespace {

using namespace test_util;

std::vector<std::string> mlp(const ScratchDir& dir, int steps, const std::string& precision = "fp16") {
  return {"training.device=cpu",
          "training.precision=" + precision,
          "model.mlp.hidden=[16]",
          "training.batch_size=16",
          "training.steps=" + std::to_string(steps),
          "schedule.warmup_steps=3",
          "logging.every=1",
          "eval.every=10",
          "checkpoint.every=10",
          "checkpoint.keep=10",
          "data.num_samples=512",
          "checkpoint.dir=" + dir.file("run")};
}

TEST(TrainFp16, FollowsFloat32LogsTheLossScaleAndResumesExactly) {
  ScratchDir full("fp16.full"), resumed("fp16.resumed"), fp32("fp16.fp32");
  RunResult a = train(config_path("mlp_synthetic.yaml"), mlp(full, 30));
  ASSERT_EQ(a.exit_code, 0) << a.output;
  EXPECT_NE(a.output.find("fp16 (float32 masters, dynamic loss scaling)"), std::string::npos) << a.output;
  EXPECT_NE(a.output.find("loss scale "), std::string::npos) << a.output;
  const std::vector<Record> records = train_records(read_metrics(full.file("run/metrics.jsonl")));
  ASSERT_EQ(records.size(), 30u);
  for (const Record& r : records) {
    const double scale = number(field(r.line, "loss_scale"));
    EXPECT_TRUE(scale > 0 && std::isfinite(scale)) << r.line;
  }
  // The same run in float32: every loss within float16 rounding (the gradients are float16).
  RunResult f = train(config_path("mlp_synthetic.yaml"), mlp(fp32, 30, "fp32"));
  ASSERT_EQ(f.exit_code, 0) << f.output;
  const std::vector<Record> reference = read_metrics(fp32.file("run/metrics.jsonl"));
  const std::vector<Record> all = read_metrics(full.file("run/metrics.jsonl"));
  ASSERT_EQ(all.size(), reference.size());
  for (size_t i = 0; i < all.size(); ++i) {
    const std::string key = all[i].type == "eval" ? all[i].val_loss : all[i].loss;
    const std::string ref = reference[i].type == "eval" ? reference[i].val_loss : reference[i].loss;
    EXPECT_NEAR(number(key), number(ref), 1e-3 * number(ref)) << all[i].line << "\n  vs " << reference[i].line;
  }

  // Resume from step 10 (the later checkpoints removed): scale, masters and optimizer state continue.
  fs::copy(full.file("run"), resumed.file("run"), fs::copy_options::recursive);
  fs::remove_all(resumed.file("run/step_00000020"));
  fs::remove_all(resumed.file("run/step_00000030"));
  RunResult b = train(config_path("mlp_synthetic.yaml"), mlp(resumed, 30));
  ASSERT_EQ(b.exit_code, 0) << b.output;
  EXPECT_NE(b.output.find("at step 10"), std::string::npos) << b.output;
  const std::vector<Record> resumed_all = read_metrics(resumed.file("run/metrics.jsonl"));
  expect_same_history(all, resumed_all, 30);
  ASSERT_EQ(all.size(), resumed_all.size());
  for (size_t i = 0; i < all.size(); ++i) {
    EXPECT_EQ(field(resumed_all[i].line, "loss_scale"), field(all[i].line, "loss_scale")) << all[i].line;
  }
}

// Regression targets of size ~100 make gradients that overflow float16 at the first scales: those steps
// are skipped and halve the scale, never count as bad steps (max_bad_steps 0 would stop the run), and
// the run finishes once the scale fits.
TEST(TrainFp16, OverflowStepsBackTheScaleOffWithoutCountingAsBadSteps) {
  ScratchDir dir("fp16.overflow");
  RunResult r = train(config_path("mlp_synthetic.yaml"),
                      {"training.device=cpu", "training.precision=fp16", "data.kind=synthetic_regression",
                       "data.num_features=8", "data.noise=100", "training.steps=30", "schedule.warmup_steps=3",
                       "training.max_bad_steps=0", "logging.every=10", "checkpoint.dir=" + dir.file("run")});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("fp16 gradient overflow at loss scale 65536: update skipped, loss scale now 32768"),
            std::string::npos)
      << r.output;
  double previous = 65536;
  int skipped = 0;
  for (const Record& rec : train_records(read_metrics(dir.file("run/metrics.jsonl")))) {
    const double scale = number(field(rec.line, "loss_scale"));
    if (rec.skipped) {
      ++skipped;
      EXPECT_TRUE(rec.grad_norm == "null") << rec.line;  // inf: the update was skipped
    }
    EXPECT_LE(scale, previous) << rec.line;  // 30 steps: far from a growth interval
    previous = scale;
  }
  EXPECT_GE(skipped, 1);
  EXPECT_LT(previous, 65536.0);
}

}  // namespace
}  // namespace dpt::train
