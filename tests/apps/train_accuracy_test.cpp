// Validation accuracy of classifiers: dpt-train reports the fraction of evaluated examples whose largest
// logit is their label beside the loss (log line, metrics.jsonl's val_accuracy); this test recounts it
// from the final checkpoint's outputs on the same validation batches. Regression reports none.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "config.h"
#include "core/autograd.h"
#include "core/factory.h"
#include "data_factory.h"
#include "model_factory.h"
#include "optim/checkpoint.h"
#include "train_test_util.h"

namespace dpt::train {
namespace {

using namespace test_util;

// Three well separated Gaussian clusters; 64 held-out examples, of which eval.batches 3 x 16 are scored.
std::vector<std::string> separable(const ScratchDir& dir) {
  return {"training.device=cpu",     "data.pattern=clusters",
          "data.num_features=4",     "data.num_classes=3",
          "data.noise=0.3",          "data.num_samples=256",
          "data.val_fraction=0.25",  "model.mlp.hidden=[16]",
          "training.batch_size=16",  "training.steps=30",
          "schedule.warmup_steps=1", "optim.lr=0.01",
          "eval.every=10",           "eval.batches=3",
          "logging.every=10",        "checkpoint.dir=" + dir.file("run")};
}

TEST(TrainAccuracy, ValidationAccuracyEqualsACountOfArgmaxEqualsLabelOnTheSameBatches) {
  ScratchDir dir("accuracy");
  const std::vector<std::string> overrides = separable(dir);
  RunResult r = train(config_path("mlp_synthetic.yaml"), overrides);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto evals = eval_records(read_metrics(dir.file("run/metrics.jsonl")));
  ASSERT_EQ(evals.size(), 3u) << r.output;  // steps 10, 20, 30
  for (const auto& e : evals) ASSERT_FALSE(field(e.line, "val_accuracy").empty()) << e.line;
  const double reported = number(field(evals.back().line, "val_accuracy"));
  EXPECT_NE(r.output.find(fmt::format("accuracy {:.4f} after 30 steps", reported)), std::string::npos) << r.output;

  // The same model and validation rows, recounted here from the logits.
  const Config config = load_config(config_path("mlp_synthetic.yaml"), overrides);
  const DataBundle data = make_data(config);
  ASSERT_TRUE(data.val);
  Generator gen(static_cast<uint64_t>(config.training.seed));
  Model model(config, data.shape, gen);
  model.module()->load_state_dict(optim::load_checkpoint(dir.file("run/step_00000030/checkpoint")).model);
  std::vector<int64_t> rows(48);
  for (int64_t i = 0; i < 48; ++i) rows[static_cast<size_t>(i)] = i;
  const data::Batch batch = data.val->get_batch(rows);
  NoGradGuard no_grad;
  const std::vector<float> logits = model.module()->forward(batch.input).to_vector<float>();
  const std::vector<int32_t> labels = batch.target.to_vector<int32_t>();
  ASSERT_EQ(logits.size(), 48u * 3u);
  int correct = 0;
  for (size_t i = 0; i < 48; ++i) {
    const auto first = logits.begin() + static_cast<std::ptrdiff_t>(3 * i);
    correct += std::max_element(first, first + 3) - first == labels[i] ? 1 : 0;
  }
  EXPECT_EQ(reported, correct / 48.0);
  EXPECT_GT(correct, 40) << "separable clusters should be learned in 30 steps";
}

TEST(TrainAccuracy, RegressionReportsNoAccuracy) {
  ScratchDir dir("accuracy.regression");
  RunResult r = train(config_path("mlp_synthetic.yaml"),
                      {"training.device=cpu", "data.kind=synthetic_regression", "data.num_features=4",
                       "model.mlp.hidden=[8]", "training.steps=3", "schedule.warmup_steps=1", "data.num_samples=128",
                       "training.batch_size=16", "checkpoint.dir=" + dir.file("run")});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto evals = eval_records(read_metrics(dir.file("run/metrics.jsonl")));
  ASSERT_FALSE(evals.empty());
  EXPECT_TRUE(field(evals.back().line, "val_accuracy").empty()) << evals.back().line;
  EXPECT_EQ(r.output.find(", accuracy "), std::string::npos) << r.output;
}

}  // namespace
}  // namespace dpt::train
