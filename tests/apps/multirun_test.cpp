// dpt-train --multirun (apps/train/multirun.h): sweeps parsed as Hydra writes them, every combination
// run in its own directory on a tiny CPU config, and the summary's numbers equal to those in each run's
// metrics.jsonl; a metrics file that is not JSON is an error naming the file and line.
#include "multirun.h"

#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "train_test_util.h"

namespace dpt::train {
namespace {

using namespace test_util;

TEST(MultirunSweep, CommasSeparateChoicesExceptInsideListsAndQuotes) {
  const SweepDimension lr = parse_sweep("optim.lr=0.01,0.003,1e-4");
  EXPECT_EQ(lr.key, "optim.lr");
  EXPECT_EQ(lr.choices, (std::vector<std::string>{"0.01", "0.003", "1e-4"}));
  EXPECT_EQ(parse_sweep("++model.mlp.hidden=[64,64],[32]").choices, (std::vector<std::string>{"[64,64]", "[32]"}));
  EXPECT_EQ(parse_sweep("logging.level='a,b'").choices.size(), 1u);
  EXPECT_THROW(parse_sweep("optim.lr=0.1,,0.2"), std::exception);
  EXPECT_THROW(parse_sweep("optim.lr"), std::exception);
}

TEST(MultirunSweep, EveryCombinationTheLastKeyFastestWithOneDirectoryNameEach) {
  const auto combinations = sweep_combinations({parse_sweep("a=1,2"), parse_sweep("+b.c=x,y,z")});
  ASSERT_EQ(combinations.size(), 6u);
  EXPECT_EQ(combinations[1], (std::vector<std::string>{"a=1", "+b.c=y"}));
  EXPECT_EQ(run_name(combinations[1]), "a_1__b.c_y");
  EXPECT_EQ(run_name({"model.mlp.hidden=[64, 64]"}), "model.mlp.hidden__64__64_");
}

TEST(MultirunSummary, AMetricsLineThatIsNotJsonIsAnErrorNamingTheFileAndLine) {
  ScratchDir dir("multirun_bad_metrics");
  std::ofstream(dir.file("metrics.jsonl")) << "{\"type\": \"eval\", \"step\": 2, \"val_loss\": 0.5}\n{\"type\": \"tr\n";
  try {
    summarize_run(dir.file("metrics.jsonl"));
    ADD_FAILURE() << "a malformed metrics file was summarized";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find(dir.file("metrics.jsonl") + ":2: not a JSON record"), std::string::npos)
        << e.what();
  }
}

// The last eval record's val_loss of a metrics file, as the trainer wrote it.
double last_val_loss(const std::string& metrics) {
  const auto evals = eval_records(read_metrics(metrics));
  return evals.empty() ? std::nan("") : number(evals.back().val_loss);
}

TEST(Multirun, RunsEveryCombinationInItsOwnDirectoryAndSummarizesThem) {
  ScratchDir dir("multirun");
  const std::string command = bin("dpt-train") + " -c " + quote(config_path("mlp_synthetic.yaml")) +
                              " --multirun training.device=cpu training.steps=4 schedule.warmup_steps=0 "
                              "eval.every=2 eval.batches=1 logging.every=1 data.num_samples=256 "
                              "model.mlp.hidden=[16] checkpoint.dir=" +
                              quote(dir.file("run")) + " optim.lr=0.01,0.001 --set training.batch_size=16,32";
  const RunResult r = run_shell(command);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string multirun = dir.file("run/multirun");
  const std::vector<std::string> names = {
      "optim.lr_0.01__training.batch_size_16", "optim.lr_0.01__training.batch_size_32",
      "optim.lr_0.001__training.batch_size_16", "optim.lr_0.001__training.batch_size_32"};
  std::ifstream csv(multirun + "/summary.csv");
  std::string header;
  std::getline(csv, header);
  EXPECT_EQ(header, "run,optim.lr,training.batch_size,exit_code,final_val_loss,best_val_loss,throughput,unit");
  std::vector<double> finals;
  for (const auto& name : names) {
    SCOPED_TRACE(name);
    const std::string metrics = multirun + "/" + name + "/metrics.jsonl";
    ASSERT_TRUE(fs::exists(metrics)) << r.output;
    EXPECT_TRUE(fs::exists(multirun + "/" + name + "/config.yaml"));
    std::string row;
    ASSERT_TRUE(std::getline(csv, row));
    std::vector<std::string> cells;
    std::istringstream fields(row);
    for (std::string cell; std::getline(fields, cell, ',');) cells.push_back(cell);
    ASSERT_EQ(cells.size(), 8u) << row;
    EXPECT_EQ(cells[0], name);
    EXPECT_EQ(cells[3], "0");
    // The summary's final validation loss is the run's own, digit for digit.
    EXPECT_EQ(std::stod(cells[4]), last_val_loss(metrics)) << row;
    EXPECT_GE(std::stod(cells[4]), std::stod(cells[5])) << "the best loss is at most the final one: " << row;
    EXPECT_GT(std::stod(cells[6]), 0) << row;
    EXPECT_EQ(cells[7], "samples/s");
    finals.push_back(std::stod(cells[4]));
  }
  EXPECT_NE(finals[0], finals[2]) << "the learning rate reached the runs";
  const std::string md = read_text(multirun + "/summary.md");
  EXPECT_NE(md.find("| run | optim.lr | training.batch_size | exit code | final val loss |"), std::string::npos) << md;
  EXPECT_NE(md.find("| optim.lr_0.001__training.batch_size_32 | 0.001 | 32 | 0 |"), std::string::npos) << md;
}

TEST(Multirun, NeedsASweepAndRefusesAnInvalidCombinationBeforeAnyRun) {
  ScratchDir dir("multirun_invalid");
  const std::string base = bin("dpt-train") + " -c " + quote(config_path("mlp_synthetic.yaml")) +
                           " --multirun training.device=cpu checkpoint.dir=" + quote(dir.file("run"));
  RunResult r = run_shell(base + " optim.lr=0.01");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("needs an override with several values"), std::string::npos) << r.output;
  r = run_shell(base + " training.batch_size=16,-4");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("training.batch_size"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(dir.file("run/multirun"))) << "no run started";
}

}  // namespace
}  // namespace dpt::train
