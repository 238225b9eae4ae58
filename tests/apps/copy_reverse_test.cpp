// data.kind copy_reverse (apps/train/datasets/copy_reverse.cpp), a dataset added through the registry:
// its examples by hand, its settings in the config, and a GPT learning it through dpt-train.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "components.h"
#include "config.h"
#include "tests/apps/train_test_util.h"

namespace dpt::train {
namespace {

using namespace test_util;

const LoadOptions kNoFiles{.check_files = false, .check_device = false};

DataBundle build(const std::vector<std::string>& overrides) {
  std::vector<std::string> o = {"model.kind=gpt", "data.kind=copy_reverse"};
  o.insert(o.end(), overrides.begin(), overrides.end());
  Config c = load_config_text("", "test.yaml", o, kNoFiles);
  const auto* entry = datasets().find("copy_reverse");
  EXPECT_NE(entry, nullptr);
  return entry->make.make(c, Settings(c, "data.copy_reverse", entry->settings));
}

std::vector<int32_t> row(const Tensor& t, int64_t i) {
  std::vector<int32_t> all = t.to_vector<int32_t>();
  const int64_t n = t.size(1);
  return std::vector<int32_t>(all.begin() + i * n, all.begin() + (i + 1) * n);
}

TEST(CopyReverseData, ExamplesAreSymbolsSeparatorAndTheReversedSymbols) {
  DataBundle d = build({"data.copy_reverse.length=3", "data.copy_reverse.symbols=5", "data.copy_reverse.examples=20",
                        "data.val_fraction=0.25"});
  EXPECT_TRUE(d.shape.tokens);
  EXPECT_EQ(d.shape.seq_len, 6);
  EXPECT_EQ(d.shape.vocab_size, 6);
  ASSERT_EQ(d.train->size(), 20);
  ASSERT_NE(d.val, nullptr);
  EXPECT_EQ(d.val->size(), 5);
  data::Batch b = d.train->get_batch({0, 7, 19});
  ASSERT_EQ(b.input.shape(), (Shape{3, 6}));
  bool any_differs = false;
  for (int64_t i = 0; i < 3; ++i) {
    const auto in = row(b.input, i), tg = row(b.target, i);
    for (int j = 0; j < 3; ++j) EXPECT_TRUE(in[j] >= 0 && in[j] < 5) << in[j];
    EXPECT_EQ(in[3], 5) << "separator";
    EXPECT_EQ((std::vector<int32_t>{tg[0], tg[1], tg[2]}), (std::vector<int32_t>{-100, -100, -100}));
    EXPECT_EQ((std::vector<int32_t>{tg[3], tg[4], tg[5]}), (std::vector<int32_t>{in[2], in[1], in[0]}));
    EXPECT_EQ((std::vector<int32_t>{in[4], in[5]}), (std::vector<int32_t>{in[2], in[1]}));  // teacher forcing
    any_differs = any_differs || in[0] != in[2];
  }
  EXPECT_TRUE(any_differs) << "symbols look constant";
}

TEST(CopyReverseData, CopyTaskRepeatsTheSymbolsAndTheSeedDecidesThem) {
  DataBundle a = build({"data.copy_reverse.task=copy", "data.copy_reverse.length=4", "training.seed=1"});
  DataBundle b = build({"data.copy_reverse.task=copy", "data.copy_reverse.length=4", "training.seed=1"});
  DataBundle c = build({"data.copy_reverse.task=copy", "data.copy_reverse.length=4", "training.seed=2"});
  const auto in = row(a.train->get_batch({3}).input, 0), tg = row(a.train->get_batch({3}).target, 0);
  EXPECT_EQ((std::vector<int32_t>{tg[4], tg[5], tg[6], tg[7]}), (std::vector<int32_t>{in[0], in[1], in[2], in[3]}));
  EXPECT_EQ(a.train->get_batch({0, 1, 2}).input.to_vector<int32_t>(),
            b.train->get_batch({0, 1, 2}).input.to_vector<int32_t>());
  EXPECT_NE(a.train->get_batch({0, 1, 2}).input.to_vector<int32_t>(),
            c.train->get_batch({0, 1, 2}).input.to_vector<int32_t>());
  EXPECT_NE(a.train->get_batch({0, 1, 2}).input.to_vector<int32_t>(),
            a.val->get_batch({0, 1, 2}).input.to_vector<int32_t>());
}

TEST(CopyReverseData, TheConfigValidatesItsSettingsAndTheModelItFeeds) {
  auto problems = [](const std::vector<std::string>& o) {
    try {
      load_config_text("", "test.yaml", o, kNoFiles);
    } catch (const ConfigError& e) {
      return e.problems();
    }
    return std::vector<std::string>{};
  };
  auto p = problems({"model.kind=gpt", "data.kind=copy_reverse", "data.copy_reverse.task=rotate"});
  ASSERT_EQ(p.size(), 1u);
  EXPECT_NE(p[0].find("one of copy | reverse"), std::string::npos) << p[0];
  p = problems({"model.kind=gpt", "data.kind=copy_reverse", "data.copy_reverse.lenght=4"});
  ASSERT_EQ(p.size(), 1u);
  EXPECT_NE(p[0].find("did you mean 'data.copy_reverse.length'"), std::string::npos) << p[0];
  p = problems({"model.kind=mlp", "data.kind=copy_reverse"});
  ASSERT_EQ(p.size(), 1u);
  EXPECT_NE(p[0].find("model.kind mlp needs feature data"), std::string::npos) << p[0];
  EXPECT_TRUE(problems({"model.kind=gpt", "data.kind=copy_reverse"}).empty());
}

TEST(CopyReverseData, AGptLearnsToReverseThroughDptTrain) {
  ScratchDir dir("copy_reverse");
  RunResult r = train(
      config_path("char_gpt.yaml"),
      {"training.device=cpu", "data.kind=copy_reverse", "data.copy_reverse.length=4", "data.copy_reverse.symbols=4",
       "data.copy_reverse.examples=2048", "model.gpt.n_layer=2", "model.gpt.n_head=2", "model.gpt.n_embd=32",
       "training.batch_size=32", "training.steps=200", "optim.lr=0.003", "schedule.warmup_steps=10", "logging.every=1",
       "eval.every=0", "eval.sample_tokens=0", "checkpoint.every=0", "checkpoint.dir=" + dir.file("run")});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto losses = train_records(read_metrics(dir.file("run/metrics.jsonl")));
  ASSERT_EQ(losses.size(), 200u);
  // ln 5 at the start (uniform over the vocabulary); a model that reverses is near 0.
  EXPECT_GT(number(losses.front().loss), 1.0);
  EXPECT_LT(number(losses.back().loss), 0.5) << r.output;
}

}  // namespace
}  // namespace dpt::train
