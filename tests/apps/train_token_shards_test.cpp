// dpt-train on llm.c-style sharded token data: data.path and data.val_path as globs train end to end,
// and a pattern that matches no file is a config error naming the key and the pattern.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "data/token_file.h"
#include "train_test_util.h"

namespace dpt::train {
namespace {

using namespace test_util;

std::vector<std::string> tiny_gpt_on(const ScratchDir& dir, const std::string& train, const std::string& val) {
  return {
      "training.device=cpu",  "model.kind=gpt",        "data.kind=tokens",        "data.path=" + train,
      "data.val_path=" + val, "model.gpt.n_layer=1",   "model.gpt.n_head=2",      "model.gpt.n_embd=16",
      "data.seq_len=8",       "training.batch_size=4", "training.steps=3",        "eval.batches=1",
      "eval.sample_tokens=0", "logging.every=1",       "schedule.warmup_steps=1", "checkpoint.dir=" + dir.file("run")};
}

TEST(TrainTokenShards, GlobsOfShardsTrainAndEvaluate) {
  ScratchDir dir("shards.train");
  for (int k = 0; k < 3; ++k)
    data::write_token_file(dir.file("fw_train_00000" + std::to_string(k) + ".bin"), data::synthetic_tokens(400, 64, k));
  data::write_token_file(dir.file("fw_val_000000.bin"), data::synthetic_tokens(300, 64, 7));
  RunResult r =
      train(config_path("gpt2_124m.yaml"), tiny_gpt_on(dir, dir.file("fw_train_*.bin"), dir.file("fw_val_*.bin")));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("3 files, 1200 tokens"), std::string::npos) << r.output;
  const auto records = read_metrics(dir.file("run/metrics.jsonl"));
  ASSERT_FALSE(eval_records(records).empty()) << r.output;
  EXPECT_EQ(train_records(records).back().step, 3);
}

TEST(TrainTokenShards, APatternMatchingNoFileIsAConfigErrorNamingIt) {
  ScratchDir dir("shards.none");
  data::write_token_file(dir.file("val.bin"), data::synthetic_tokens(300, 64, 7));
  const std::string pattern = dir.file("fineweb_train_*.bin");
  RunResult r = train(config_path("gpt2_124m.yaml"), tiny_gpt_on(dir, pattern, dir.file("val.bin")));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("data.path"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("no file matches the pattern '" + pattern + "'"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(dir.file("run")));
}

}  // namespace
}  // namespace dpt::train
