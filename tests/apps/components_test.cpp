// Registered components (apps/train/components.h) in the config and in dpt-train: their names and
// settings are validated like built-in keys, listed in the reference, and the trainer builds them.
#include "components.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "config.h"
#include "core/safetensors.h"
#include "tests/apps/train_test_util.h"

namespace dpt::train {
namespace {

using namespace test_util;

const LoadOptions kNoFiles{.check_files = false, .check_device = false};

std::vector<std::string> problems_of(const std::string& yaml, const std::vector<std::string>& overrides = {}) {
  try {
    load_config_text(yaml, "test.yaml", overrides, kNoFiles);
  } catch (const ConfigError& e) {
    return e.problems();
  }
  ADD_FAILURE() << "config loaded but should have failed:\n" << yaml;
  return {};
}

void expect_one_problem(const std::string& yaml, const std::vector<std::string>& parts) {
  auto problems = problems_of(yaml);
  ASSERT_EQ(problems.size(), 1u) << (problems.empty() ? "" : problems[0]);
  for (const auto& part : parts)
    EXPECT_NE(problems[0].find(part), std::string::npos) << problems[0] << "\nmissing: " << part;
}

TEST(ComponentConfig, RegisteredSettingsHaveTheirDefaultsAndTakeValues) {
  Config defaults = load_config_text("", "test.yaml", {}, kNoFiles);
  EXPECT_EQ(defaults.components.floats.at("optim.lion.beta2"), 0.99);
  Config c = load_config_text("optim:\n  kind: lion\n  lion:\n    beta2: 0.95\n", "test.yaml", {"optim.lion.beta1=0.8"},
                              kNoFiles);
  EXPECT_EQ(c.optim.kind, "lion");
  EXPECT_EQ(c.components.floats.at("optim.lion.beta1"), 0.8);
  EXPECT_EQ(c.components.floats.at("optim.lion.beta2"), 0.95);
  const auto* lion = optimizers().find("lion");
  ASSERT_NE(lion, nullptr);
  Settings s(c, "optim.lion", lion->settings);
  EXPECT_EQ(s.number("beta1"), 0.8);
  EXPECT_THROW(s.number("beta3"), Error);
}

TEST(ComponentConfig, RegisteredSettingsAreValidatedLikeBuiltInKeys) {
  expect_one_problem("optim:\n  lion:\n    beta2: 1.5\n", {"test.yaml:3:", "optim.lion.beta2", "in [0, 1]", "1.5"});
  expect_one_problem("optim:\n  lion:\n    beta2: fast\n", {"optim.lion.beta2", "expected a number"});
  expect_one_problem("optim:\n  lion:\n    beta3: 0.9\n",
                     {"optim.lion.beta3", "unknown key", "did you mean 'optim.lion.beta1'"});
  expect_one_problem("optim:\n  kind: lian\n", {"optim.kind", "lion", "did you mean 'lion'"});
  expect_one_problem("model:\n  gpt:\n    ffn: swiglo\n",
                     {"model.gpt.ffn", "one of mlp | swiglu", "did you mean 'swiglu'"});
}

TEST(ComponentConfig, TheReferenceAndTheResolvedYamlCarryRegisteredKeys) {
  const std::string ref = config_reference();
  EXPECT_NE(ref.find("| `optim.lion.beta2` | number | `0.99` | a number in [0, 1] |"), std::string::npos) << ref;
  EXPECT_NE(ref.find("`model.gpt.ffn` | choice | `mlp` | one of mlp \\| swiglu"), std::string::npos);
  // Each registered name is described by its entry's help, which no config code repeats.
  EXPECT_NE(ref.find("| `model.gpt.ffn` | `swiglu` | LLaMA: proj(silu(gate(x)) * up(x))"), std::string::npos) << ref;
  EXPECT_NE(ref.find("| `optim.kind` | `lion` | Lion: sign of an interpolated momentum"), std::string::npos) << ref;
  EXPECT_NE(ref.find("| `data.kind` | `copy_reverse` | "), std::string::npos) << ref;
  // Registered keys come right after their section's built-in keys, before the next section.
  EXPECT_LT(ref.find("`optim.lion.beta1`"), ref.find("`schedule.kind`"));
  EXPECT_GT(ref.find("`optim.lion.beta1`"), ref.find("`optim.nesterov`"));
  Config c = load_config_text("", "test.yaml", {"optim.kind=lion", "optim.lion.beta2=0.9"}, kNoFiles);
  Config back = load_config_text(to_yaml(c), "resolved.yaml", {}, kNoFiles);
  EXPECT_EQ(back.optim.kind, "lion");
  EXPECT_EQ(back.components.floats.at("optim.lion.beta2"), 0.9);
}

// The kinds the reference allows for a kind key: its "one of a \| b" cell, split.
std::vector<std::string> allowed_kinds(const std::string& reference, const std::string& key) {
  const size_t row = reference.find("| `" + key + "` | choice | ");
  if (row == std::string::npos) {
    ADD_FAILURE() << key << " is not in the reference";
    return {};
  }
  const std::string one_of = "one of ", separator = " \\| ";
  const size_t begin = reference.find(one_of, row) + one_of.size();
  const std::string cell = reference.substr(begin, reference.find(" | ", begin) - begin);
  std::vector<std::string> kinds;
  for (size_t at = 0, next = 0; next != std::string::npos; at = next + separator.size()) {
    next = cell.find(separator, at);
    kinds.push_back(cell.substr(at, next - at));
  }
  return kinds;
}

// model_factory.cpp and data_factory.cpp build only what their registry holds: a kind the config accepts
// without an entry would pass validation and fail to build.
TEST(ComponentConfig, EveryKindTheReferenceListsIsARegistryEntry) {
  const std::string ref = config_reference();
  auto expect_registered = [&](const std::string& key, const auto& registry, const std::vector<std::string>& builtins) {
    const std::vector<std::string> kinds = allowed_kinds(ref, key);
    for (const std::string& name : builtins)
      EXPECT_NE(std::find(kinds.begin(), kinds.end(), name), kinds.end()) << key << ": " << name << " not listed";
    for (const std::string& name : kinds) EXPECT_NE(registry.find(name), nullptr) << key << ": " << name;
    EXPECT_EQ(kinds.size(), registry.entries().size()) << key;
  };
  expect_registered("model.kind", models(), {"mlp", "gpt", "cnn"});
  expect_registered("data.kind", datasets(),
                    {"synthetic_classification", "synthetic_regression", "synthetic_images", "synthetic_tokens",
                     "tokens", "text", "mnist"});
  expect_registered("optim.kind", optimizers(), {"adamw", "adam", "sgd"});
  expect_registered("schedule.kind", schedules(), {"constant", "cosine", "step"});
}

TEST(ComponentConfig, LinearScheduleWarmsUpThenFallsToItsFinalFraction) {
  Config c = load_config_text(
      "", "test.yaml",
      {"optim.lr=0.1", "schedule.kind=linear", "schedule.linear.warmup_steps=2", "schedule.linear.final_fraction=0.5"},
      kNoFiles);
  const auto* entry = schedules().find("linear");
  ASSERT_NE(entry, nullptr);
  auto schedule = entry->make(c, Settings(c, "schedule.linear", entry->settings), 12);
  EXPECT_DOUBLE_EQ(schedule->lr(0), 0.05);
  EXPECT_DOUBLE_EQ(schedule->lr(1), 0.1);
  EXPECT_DOUBLE_EQ(schedule->lr(2), 0.1);
  EXPECT_DOUBLE_EQ(schedule->lr(7), 0.075);
  EXPECT_DOUBLE_EQ(schedule->lr(12), 0.05);
  EXPECT_DOUBLE_EQ(schedule->lr(100), 0.05);
  EXPECT_THROW(entry->make(c, Settings(c, "schedule.linear", entry->settings), 2), Error);
}

// --- dpt-train ---------------------------------------------------------------------------------

std::vector<std::string> mlp_run(const ScratchDir& dir, int steps) {
  return {"training.device=cpu",
          "model.mlp.hidden=[32]",
          "training.batch_size=64",
          "training.steps=" + std::to_string(steps),
          "schedule.kind=constant",
          "logging.every=1",
          "eval.every=0",
          "checkpoint.every=" + std::to_string(steps / 2),
          "checkpoint.keep=5",
          "data.num_samples=512",
          "checkpoint.dir=" + dir.file("run")};
}

TEST(TrainComponents, LionFromTheConfigTrainsAndResumesExactly) {
  ScratchDir full("lion.full"), resumed("lion.resumed");
  std::vector<std::string> o = mlp_run(full, 80);
  o.insert(o.end(), {"optim.kind=lion", "optim.lr=0.003", "optim.weight_decay=0.1"});
  RunResult a = train(config_path("mlp_synthetic.yaml"), o);
  ASSERT_EQ(a.exit_code, 0) << a.output;
  auto losses = train_records(read_metrics(full.file("run/metrics.jsonl")));
  ASSERT_EQ(losses.size(), 80u) << a.output;
  EXPECT_LT(number(losses.back().loss), 0.7 * number(losses.front().loss)) << a.output;
  // Lion's one state tensor per parameter is what the checkpoint holds.
  const auto state = load_safetensors(full.file("run/step_00000080/checkpoint.optim.safetensors"));
  bool has_exp_avg = false, has_adam_second_moment = false;
  for (const auto& [name, t] : state.tensors) {
    has_exp_avg = has_exp_avg || name.rfind("exp_avg.", 0) == 0;
    has_adam_second_moment = has_adam_second_moment || name.rfind("exp_avg_sq.", 0) == 0;
  }
  EXPECT_TRUE(has_exp_avg);
  EXPECT_FALSE(has_adam_second_moment);

  fs::copy(full.file("run"), resumed.file("run"), fs::copy_options::recursive);
  fs::remove_all(resumed.file("run/step_00000080"));
  std::vector<std::string> r = mlp_run(resumed, 80);
  r.insert(r.end(), {"optim.kind=lion", "optim.lr=0.003", "optim.weight_decay=0.1"});
  RunResult b = train(config_path("mlp_synthetic.yaml"), r);
  ASSERT_EQ(b.exit_code, 0) << b.output;
  EXPECT_NE(b.output.find("at step 40"), std::string::npos) << b.output;
  expect_same_history(read_metrics(full.file("run/metrics.jsonl")), read_metrics(resumed.file("run/metrics.jsonl")),
                      80);
}

TEST(TrainComponents, GptWithSwigluFeedForwardTrains) {
  ScratchDir dir("swiglu");
  RunResult r = train(config_path("char_gpt.yaml"),
                      {"training.device=cpu", "model.gpt.n_layer=1", "model.gpt.n_head=2", "model.gpt.n_embd=16",
                       "model.gpt.ffn=swiglu", "data.seq_len=16", "training.batch_size=16", "training.steps=30",
                       "schedule.warmup_steps=2", "logging.every=1", "eval.every=0", "eval.sample_tokens=0",
                       "checkpoint.every=0", "checkpoint.dir=" + dir.file("run")});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("swiglu feed-forward"), std::string::npos) << r.output;
  auto losses = train_records(read_metrics(dir.file("run/metrics.jsonl")));
  ASSERT_EQ(losses.size(), 30u);
  EXPECT_LT(number(losses.back().loss), number(losses.front().loss));
  const auto weights = load_safetensors(dir.file("run/step_00000030/checkpoint.model.safetensors"));
  EXPECT_TRUE(weights.contains("blocks.0.mlp.gate.weight")) << "no SwiGLU gate in the checkpoint";
}

TEST(TrainComponents, ARegisteredModelTrainsFromTheConfig) {
  ScratchDir dir("softmax_regression");
  std::vector<std::string> o = mlp_run(dir, 40);
  o.insert(o.end(), {"model.kind=softmax_regression", "model.softmax_regression.input_scale=0.5",
                     "data.pattern=clusters", "data.num_features=4"});
  RunResult r = train(config_path("mlp_synthetic.yaml"), o);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("softmax_regression: 4 -> 3"), std::string::npos) << r.output;
  auto losses = train_records(read_metrics(dir.file("run/metrics.jsonl")));
  ASSERT_EQ(losses.size(), 40u);
  EXPECT_LT(number(losses.back().loss), 0.7 * number(losses.front().loss)) << r.output;
  const auto weights = load_safetensors(dir.file("run/step_00000040/checkpoint.model.safetensors"));
  ASSERT_EQ(weights.tensors.size(), 2u);
  EXPECT_EQ(weights.at("weight").shape(), (Shape{3, 4}));
}

}  // namespace
}  // namespace dpt::train
