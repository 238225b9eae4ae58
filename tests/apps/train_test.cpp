// dpt-train end to end, as a user runs it: every shipped config trains on the CPU, a resumed run
// reproduces the uninterrupted run's losses exactly (after deleting checkpoints, after damaging one, and
// after SIGTERM), two processes through dpt-run match one process on the doubled batch, gradient
// accumulation matches the larger batch, non-finite steps are skipped then stop the run, and
// checkpoints of another model or world size are refused and left untouched.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "config.h"
#include "core/cuda_runtime.h"
#include "data/token_file.h"
#include "train_test_util.h"

namespace dpt::train {
namespace {

namespace fs = std::filesystem;
using namespace test_util;

// --- shipped configs ---------------------------------------------------------------------------

// Overrides that shrink a config of any size to a few seconds on one CPU core, chosen from what the
// config trains (so a new config is covered without touching this test).
std::vector<std::string> shrink(const Config& c, const ScratchDir& dir) {
  std::vector<std::string> o = {
      "training.device=cpu",     "training.steps=3",       "training.epochs=0",
      "logging.every=1",         "eval.every=2",           "eval.batches=1",
      "checkpoint.every=2",      "data.prefetch=1",        "schedule.warmup_steps=1",
      "checkpoint.enabled=true", "checkpoint.resume=auto", "checkpoint.dir=" + dir.file("run")};
  if (c.model.kind == "gpt") {
    o.insert(o.end(), {"model.gpt.n_layer=1", "model.gpt.n_head=2", "model.gpt.n_embd=16", "model.gpt.vocab_size=0",
                       "model.gpt.block_size=0", "data.seq_len=8", "training.batch_size=4", "eval.sample_tokens=8"});
    if (c.data.kind == "synthetic_tokens") {
      o.insert(o.end(), {"data.vocab_size=32", "data.num_tokens=2000", "data.path=" + dir.file("tokens.bin")});
    } else if (c.data.kind == "tokens") {
      data::write_token_file(dir.file("train.bin"), data::synthetic_tokens(3000, 64, 1));
      data::write_token_file(dir.file("val.bin"), data::synthetic_tokens(1000, 64, 2));
      o.insert(o.end(), {"data.path=" + dir.file("train.bin"), "data.val_path=" + dir.file("val.bin")});
    }
  } else if (c.model.kind == "mlp") {
    o.insert(o.end(),
             {"model.mlp.hidden=[16]", "data.num_samples=256", "training.batch_size=16", "data.num_classes=4"});
    if (c.data.kind != "synthetic_classification" || c.data.pattern != "spirals") o.push_back("data.num_features=8");
  } else if (c.model.kind == "cnn") {
    o.insert(o.end(), {"model.cnn.channels=[4]", "model.cnn.hidden=8", "data.num_samples=128", "data.image_size=8",
                       "training.batch_size=16"});
  }
  return o;
}

TEST(TrainShippedConfigs, EveryConfigTrainsAFewStepsOnTheCpu) {
  std::vector<fs::path> configs;
  for (const auto& e : fs::directory_iterator(fs::path(DPT_SOURCE_DIR) / "configs"))
    if (e.path().extension() == ".yaml") configs.push_back(e.path());
  ASSERT_GE(configs.size(), 7u);
  for (const auto& path : configs) {
    SCOPED_TRACE(path.filename().string());
    ScratchDir dir("shipped." + path.stem().string());
    const Config parsed = load_config(path.string(), {}, {.check_files = false, .check_device = false});
    RunResult r = train(path.string(), shrink(parsed, dir));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    auto records = read_metrics(dir.file("run/metrics.jsonl"));
    auto losses = train_records(records);
    ASSERT_EQ(losses.size(), 3u) << r.output;
    for (const auto& rec : losses) EXPECT_TRUE(std::isfinite(number(rec.loss))) << rec.line;
    EXPECT_FALSE(eval_records(records).empty()) << "no validation loss logged\n" << r.output;
    if (!eval_records(records).empty()) {
      EXPECT_NE(eval_records(records).back().line.find("\"best_val_loss\""), std::string::npos) << r.output;
    }
    EXPECT_TRUE(fs::exists(dir.file("run/step_00000003/checkpoint.model.safetensors")));
    EXPECT_TRUE(fs::exists(dir.file("run/step_00000002")));
    EXPECT_TRUE(fs::exists(dir.file("run/config.yaml")));
    // The resolved config loads back to the same training setup.
    const Config resolved = load_config(dir.file("run/config.yaml"), {}, {.check_files = false, .check_device = false});
    EXPECT_EQ(resolved.training.steps, 3);
    EXPECT_EQ(resolved.model.kind, parsed.model.kind);
    if (parsed.model.kind == "gpt") {
      EXPECT_NE(r.output.find("sample ("), std::string::npos) << r.output;
    }
  }
}

// --- resume ------------------------------------------------------------------------------------

std::vector<std::string> small_mlp(const ScratchDir& dir, int steps) {
  return {"training.device=cpu",
          "model.mlp.hidden=[16]",
          "training.batch_size=16",
          "training.grad_accum=2",
          "training.steps=" + std::to_string(steps),
          "schedule.warmup_steps=3",
          "logging.every=1",
          "eval.every=10",
          "checkpoint.every=10",
          "checkpoint.keep=10",
          "data.num_samples=512",
          "checkpoint.dir=" + dir.file("run")};
}

std::vector<std::string> small_gpt(const ScratchDir& dir, int steps) {
  return {"training.device=cpu",
          "model.gpt.n_layer=1",
          "model.gpt.n_head=2",
          "model.gpt.n_embd=16",
          "model.gpt.dropout=0.1",
          "data.seq_len=16",
          "training.batch_size=48",  // 7 batches an epoch: 12 steps cross two epochs of fresh random windows
          "training.steps=" + std::to_string(steps),
          "schedule.warmup_steps=2",
          "logging.every=1",
          "eval.every=4",
          "eval.batches=1",
          "eval.sample_tokens=0",
          "checkpoint.every=4",
          "checkpoint.keep=10",
          "checkpoint.dir=" + dir.file("run")};
}

// training.cuda_graph on a GPU: after two eager steps every step replays the captured forward and
// backward; the run must reproduce the eager run digit for digit (losses, learning rates, gradient norms,
// validation losses), and a run resumed from a checkpoint (which captures again after its own two eager
// steps) must reproduce both.
std::vector<std::string> gpu_gpt(const ScratchDir& dir, bool graph) {
  return {"training.device=cuda",
          "training.cuda_graph=" + std::string(graph ? "true" : "false"),
          "model.gpt.n_layer=2",
          "model.gpt.n_head=4",
          "model.gpt.n_embd=64",
          "data.seq_len=64",
          "training.batch_size=8",
          "training.steps=12",
          "schedule.warmup_steps=3",
          "logging.every=1",
          "eval.every=4",
          "eval.batches=2",
          "eval.sample_tokens=0",
          "checkpoint.every=4",
          "checkpoint.keep=10",
          "checkpoint.dir=" + dir.file("run")};
}

// The eager run, the captured one and the captured one resumed at step 4: one history, digit for digit.
void expect_graph_reproduces_eager(const std::string& name, const std::vector<std::string>& extra) {
  ScratchDir eager(name + ".eager"), graph(name + ".graph"), resumed(name + ".resumed");
  auto args = [&](const ScratchDir& dir, bool captured) {
    std::vector<std::string> a = gpu_gpt(dir, captured);
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  };
  RunResult a = train(config_path("char_gpt.yaml"), args(eager, false));
  ASSERT_EQ(a.exit_code, 0) << a.output;
  RunResult b = train(config_path("char_gpt.yaml"), args(graph, true));
  ASSERT_EQ(b.exit_code, 0) << b.output;
  expect_same_history(read_metrics(eager.file("run/metrics.jsonl")), read_metrics(graph.file("run/metrics.jsonl")),
                      12);
  fs::copy(graph.file("run"), resumed.file("run"), fs::copy_options::recursive);
  fs::remove_all(resumed.file("run/step_00000008"));
  fs::remove_all(resumed.file("run/step_00000012"));
  RunResult c = train(config_path("char_gpt.yaml"), args(resumed, true));
  ASSERT_EQ(c.exit_code, 0) << c.output;
  EXPECT_NE(c.output.find("at step 4"), std::string::npos) << c.output;
  expect_same_history(read_metrics(eager.file("run/metrics.jsonl")), read_metrics(resumed.file("run/metrics.jsonl")),
                      12);
}

TEST(TrainCudaGraph, ReplayedStepsReproduceTheEagerRunAndResumeExactly) {
  if (!cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  expect_graph_reproduces_eager("graph", {});
}

// Dropout in a graph draws from a device counter the graph moves on: every replay a fresh mask, the same
// masks as the eager run's (the same generator offsets), and a resume continues them.
TEST(TrainCudaGraph, ReplayedStepsWithDropoutReproduceTheEagerRunAndResumeExactly) {
  if (!cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  expect_graph_reproduces_eager("graph.dropout", {"model.gpt.dropout=0.2"});
}

// An eager 2-GPU ZeRO-1 run against a captured one with `graph_extra` set too: the same metrics, digit for
// digit. Returns the captured run's output.
std::string expect_captured_zero_run_matches_eager(const std::string& name,
                                                   const std::vector<std::string>& graph_extra) {
  ScratchDir eager("graph." + name + ".eager"), graph("graph." + name + ".graph");
  std::vector<std::string> a_args = gpu_gpt(eager, false), b_args = gpu_gpt(graph, true);
  a_args.push_back("distributed.strategy=zero");
  b_args.push_back("distributed.strategy=zero");
  b_args.insert(b_args.end(), graph_extra.begin(), graph_extra.end());
  RunResult a = train(config_path("char_gpt.yaml"), a_args, 2);
  EXPECT_EQ(a.exit_code, 0) << a.output;
  RunResult b = train(config_path("char_gpt.yaml"), b_args, 2);
  EXPECT_EQ(b.exit_code, 0) << b.output;
  if (a.exit_code == 0 && b.exit_code == 0) {
    expect_same_history(read_metrics(eager.file("run/metrics.jsonl")), read_metrics(graph.file("run/metrics.jsonl")),
                        12);
  }
  return b.output;
}

// ZeRO-1 on two GPUs: the graph holds the reduce-scatters, the trainer steps the shards eagerly.
TEST(TrainCudaGraph, TwoGpusUnderZeroReproduceTheEagerRunExactly) {
  if (!cuda::is_available() || cuda::device_count() < 2) GTEST_SKIP() << "needs 2 CUDA devices";
  expect_captured_zero_run_matches_eager("zero", {});
}

// distributed.copy_engines averages each block as the mean of two bf16 values rounded once, as NCCL's
// reduce-scatter does, and moves the same bytes: the captured run on the copy engines equals the eager
// run on NCCL's kernels digit for digit.
TEST(TrainCudaGraph, TwoGpusUnderZeroOnTheCopyEnginesMatchTheNcclRunExactly) {
  if (!cuda::is_available() || cuda::device_count() < 2) GTEST_SKIP() << "needs 2 CUDA devices";
  std::string output = expect_captured_zero_run_matches_eager("zero_engines", {"distributed.copy_engines=true"});
  EXPECT_NE(output.find("optimizer sharded (ZeRO-1, exchanged by the copy engines)"), std::string::npos) << output;
}

// The graph through dpt-run on two GPUs under DDP: the AllReduces, launched by the gradient hooks during the
// capture, are replayed with the graph; the metrics must be the eager DDP run's, digit for digit.
TEST(TrainCudaGraph, TwoGpusUnderDdpReproduceTheEagerRunExactly) {
  if (!cuda::is_available() || cuda::device_count() < 2) GTEST_SKIP() << "needs 2 CUDA devices";
  ScratchDir eager("graph.ddp.eager"), graph("graph.ddp.graph");
  RunResult a = train(config_path("char_gpt.yaml"), gpu_gpt(eager, false), 2);
  ASSERT_EQ(a.exit_code, 0) << a.output;
  RunResult b = train(config_path("char_gpt.yaml"), gpu_gpt(graph, true), 2);
  ASSERT_EQ(b.exit_code, 0) << b.output;
  expect_same_history(read_metrics(eager.file("run/metrics.jsonl")), read_metrics(graph.file("run/metrics.jsonl")),
                      12);
}

// Without clipping, a GPU run updates before each step is decided (optim/adam.h, Adam::speculate): the same
// losses, learning rates and validation losses digit for digit as the decided path (clipping at a norm never
// reached: factor 1), gradient norms summed in another order. Checkpoints every 3 steps are saved while the
// second copies hold the state; the run resumed from step 3 continues the uninterrupted one digit for digit.
TEST(TrainSpeculativeUpdate, CudaRunWithoutClippingMatchesTheDecidedRunAndResumesExactly) {
  if (!cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  ScratchDir spec("speculative.run"), decided("speculative.decided"), resumed("speculative.resumed");
  auto args = [](const ScratchDir& dir, const std::string& clip) {
    std::vector<std::string> a = gpu_gpt(dir, true);
    a.push_back("training.grad_clip=" + clip);
    a.push_back("checkpoint.every=3");
    return a;
  };
  RunResult a = train(config_path("char_gpt.yaml"), args(spec, "0"));
  ASSERT_EQ(a.exit_code, 0) << a.output;
  EXPECT_NE(a.output.find("update  applied before its decision"), std::string::npos) << a.output;
  RunResult b = train(config_path("char_gpt.yaml"), args(decided, "1e30"));
  ASSERT_EQ(b.exit_code, 0) << b.output;
  EXPECT_NE(b.output.find("update  decided, then applied (gradient clipping"), std::string::npos) << b.output;
  const std::vector<Record> x = read_metrics(spec.file("run/metrics.jsonl"));
  const std::vector<Record> y = read_metrics(decided.file("run/metrics.jsonl"));
  expect_close_history(y, x, 12);
  for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
    EXPECT_EQ(x[i].loss, y[i].loss) << x[i].line;
    EXPECT_EQ(x[i].val_loss, y[i].val_loss) << x[i].line;
  }
  fs::copy(spec.file("run"), resumed.file("run"), fs::copy_options::recursive);
  for (const char* later : {"run/step_00000006", "run/step_00000009", "run/step_00000012"})
    fs::remove_all(resumed.file(later));
  RunResult c = train(config_path("char_gpt.yaml"), args(resumed, "0"));
  ASSERT_EQ(c.exit_code, 0) << c.output;
  EXPECT_NE(c.output.find("at step 3"), std::string::npos) << c.output;
  expect_same_history(x, read_metrics(resumed.file("run/metrics.jsonl")), 12);
}

// Under DDP's all-reduce on two GPUs every rank updates before the decision, from the same averaged
// gradients: the decided run's losses digit for digit.
TEST(TrainSpeculativeUpdate, TwoGpusUnderDdpMatchTheDecidedRun) {
  if (!cuda::is_available() || cuda::device_count() < 2) GTEST_SKIP() << "needs 2 CUDA devices";
  ScratchDir spec("speculative.ddp"), decided("speculative.ddp.decided");
  auto args = [](const ScratchDir& dir, const std::string& clip) {
    std::vector<std::string> a = small_mlp(dir, 20);
    a[0] = "training.device=cuda";
    a.insert(a.end(), {"distributed.strategy=allreduce", "training.grad_clip=" + clip});
    return a;
  };
  RunResult a = train(config_path("mlp_synthetic.yaml"), args(spec, "0"), 2);
  ASSERT_EQ(a.exit_code, 0) << a.output;
  EXPECT_NE(a.output.find("update  applied before its decision"), std::string::npos) << a.output;
  RunResult b = train(config_path("mlp_synthetic.yaml"), args(decided, "1e30"), 2);
  ASSERT_EQ(b.exit_code, 0) << b.output;
  const std::vector<Record> x = read_metrics(spec.file("run/metrics.jsonl"));
  const std::vector<Record> y = read_metrics(decided.file("run/metrics.jsonl"));
  expect_close_history(y, x, 20);
  for (size_t i = 0; i < x.size() && i < y.size(); ++i) EXPECT_EQ(x[i].loss, y[i].loss) << x[i].line;
}

TEST(TrainResume, ResumedMlpRunReproducesTheUninterruptedLossesExactly) {
  ScratchDir full("resume.mlp.full"), resumed("resume.mlp.resumed");
  RunResult a = train(config_path("mlp_synthetic.yaml"), small_mlp(full, 30));
  ASSERT_EQ(a.exit_code, 0) << a.output;
  // The first lines say how steps run and why (training.cuda_graph auto).
  EXPECT_NE(a.output.find("eager (training.cuda_graph auto: not on a GPU)"), std::string::npos) << a.output;
  // The interrupted run: the newest checkpoint damaged (truncated), the one before it gone; the run
  // must pass over both and continue from step 10.
  fs::copy(full.file("run"), resumed.file("run"), fs::copy_options::recursive);
  fs::remove_all(resumed.file("run/step_00000020"));
  fs::resize_file(resumed.file("run/step_00000030/checkpoint.model.safetensors"), 100);
  RunResult b = train(config_path("mlp_synthetic.yaml"), small_mlp(resumed, 30));
  ASSERT_EQ(b.exit_code, 0) << b.output;
  EXPECT_NE(b.output.find("skipping a damaged checkpoint"), std::string::npos) << b.output;
  EXPECT_NE(b.output.find("at step 10"), std::string::npos) << b.output;
  expect_same_history(read_metrics(full.file("run/metrics.jsonl")), read_metrics(resumed.file("run/metrics.jsonl")),
                      30);
}

TEST(TrainResume, ResumedGptRunWithDropoutReproducesTheUninterruptedLossesExactly) {
  ScratchDir full("resume.gpt.full"), resumed("resume.gpt.resumed");
  RunResult a = train(config_path("char_gpt.yaml"), small_gpt(full, 12));
  ASSERT_EQ(a.exit_code, 0) << a.output;
  fs::copy(full.file("run"), resumed.file("run"), fs::copy_options::recursive);
  fs::remove_all(resumed.file("run/step_00000008"));
  fs::remove_all(resumed.file("run/step_00000012"));
  RunResult b = train(config_path("char_gpt.yaml"), small_gpt(resumed, 12));
  ASSERT_EQ(b.exit_code, 0) << b.output;
  EXPECT_NE(b.output.find("at step 4"), std::string::npos) << b.output;
  expect_same_history(read_metrics(full.file("run/metrics.jsonl")), read_metrics(resumed.file("run/metrics.jsonl")),
                      12);
}

TEST(TrainResume, SigtermWritesACheckpointAndTheResumedRunContinuesExactly) {
  ScratchDir stopped("sigterm.stopped"), reference("sigterm.reference");
  auto args = [](const ScratchDir& dir, int steps) {
    return std::vector<std::string>{"training.device=cpu",
                                    "model.mlp.hidden=[16]",
                                    "training.batch_size=16",
                                    "training.steps=" + std::to_string(steps),
                                    "schedule.kind=constant",
                                    "logging.every=1",
                                    "eval.every=0",
                                    "eval.batches=1",
                                    "checkpoint.every=0",
                                    "data.num_samples=512",
                                    "checkpoint.dir=" + dir.file("run")};
  };
  // 1. A long run, stopped by SIGTERM once it has logged 20 steps.
  Child child = spawn_train(config_path("mlp_synthetic.yaml"), args(stopped, 1000000), stopped.file("log.txt"));
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (train_records(read_metrics(stopped.file("run/metrics.jsonl"))).size() < 20 &&
         std::chrono::steady_clock::now() < deadline && child.running()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ::kill(child.pid, SIGTERM);
  const int status = child.wait();
  const std::string log = read_text(stopped.file("log.txt"));
  ASSERT_TRUE(WIFEXITED(status)) << log;
  ASSERT_EQ(WEXITSTATUS(status), 128 + SIGTERM) << log;
  EXPECT_NE(log.find("stopped by SIGTERM"), std::string::npos) << log;
  // 2. Exactly one checkpoint, at the step the run stopped after.
  std::vector<int64_t> steps;
  for (const auto& e : fs::directory_iterator(stopped.file("run"))) {
    const std::string name = e.path().filename().string();
    if (name.rfind("step_", 0) == 0) steps.push_back(std::stoll(name.substr(5)));
  }
  ASSERT_EQ(steps.size(), 1u) << log;
  const int64_t s = steps[0];
  ASSERT_GE(s, 20);
  // 3. Continue for 5 more steps; a fresh run to the same step must log the same history.
  const int total = static_cast<int>(s) + 5;
  RunResult resumed = train(config_path("mlp_synthetic.yaml"), args(stopped, total));
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  RunResult fresh = train(config_path("mlp_synthetic.yaml"), args(reference, total));
  ASSERT_EQ(fresh.exit_code, 0) << fresh.output;
  expect_same_history(read_metrics(reference.file("run/metrics.jsonl")),
                      read_metrics(stopped.file("run/metrics.jsonl")), total);
}

TEST(TrainCheckpoints, OnlyTheNewestKeepCheckpointsRemainAndEachIsComplete) {
  ScratchDir dir("keep");
  RunResult r = train(config_path("mlp_synthetic.yaml"),
                      {"training.device=cpu", "model.mlp.hidden=[8]", "training.steps=10", "schedule.warmup_steps=1",
                       "checkpoint.every=2", "checkpoint.keep=2", "checkpoint.dir=" + dir.file("run")});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir.file("run"))) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"config.yaml", "metrics.jsonl", "step_00000008", "step_00000010"}));
  for (const char* step : {"step_00000008", "step_00000010"}) {
    EXPECT_TRUE(fs::exists(dir.file(std::string("run/") + step + "/checkpoint.model.safetensors")));
    EXPECT_TRUE(fs::exists(dir.file(std::string("run/") + step + "/checkpoint.optim.safetensors")));
  }
}

// --- data parallel -----------------------------------------------------------------------------

std::vector<std::string> parity_args(const ScratchDir& dir, int batch, int accum) {
  return {"training.device=cpu",
          "model.mlp.hidden=[32, 32]",
          "data.num_samples=2048",
          "training.batch_size=" + std::to_string(batch),
          "training.grad_accum=" + std::to_string(accum),
          "training.steps=20",
          "schedule.warmup_steps=5",
          "logging.every=1",
          "eval.every=10",
          "eval.batches=100",
          "checkpoint.every=10",
          "checkpoint.dir=" + dir.file("run")};
}

TEST(TrainDistributed, TwoProcessesThroughDptRunMatchOneProcessOnTheDoubledBatch) {
  ScratchDir one("parity.one"), two("parity.two");
  RunResult a = train(config_path("mlp_synthetic.yaml"), parity_args(one, 32, 1));
  ASSERT_EQ(a.exit_code, 0) << a.output;
  RunResult b = train(config_path("mlp_synthetic.yaml"), parity_args(two, 16, 1), /*nproc=*/2);
  ASSERT_EQ(b.exit_code, 0) << b.output;
  EXPECT_NE(b.output.find("2 process(es)"), std::string::npos) << b.output;
  // Equal up to float32 summation order (the two halves are averaged instead of summed at once).
  expect_close_history(read_metrics(one.file("run/metrics.jsonl")), read_metrics(two.file("run/metrics.jsonl")), 20);
}

TEST(TrainDistributed, GradientAccumulationMatchesTheLargerBatch) {
  ScratchDir big("accum.big"), accum("accum.small");
  RunResult a = train(config_path("mlp_synthetic.yaml"), parity_args(big, 32, 1));
  ASSERT_EQ(a.exit_code, 0) << a.output;
  RunResult b = train(config_path("mlp_synthetic.yaml"), parity_args(accum, 16, 2));
  ASSERT_EQ(b.exit_code, 0) << b.output;
  expect_close_history(read_metrics(big.file("run/metrics.jsonl")), read_metrics(accum.file("run/metrics.jsonl")), 20);
}

// A sharded run (distributed.strategy `strategy`: zero or gathered_grads) is the same run as
// plain DDP (sharded update, clipping by the global norm of every rank's share); its checkpoints hold
// whole-parameter optimizer state, so a resumed sharded run continues exactly and a plain DDP run can
// continue from them too. Four classes: gathered gradients give each rank an equal block of every layer's rows.
void expect_sharded_run_matches_ddp_and_resumes_either_way(const std::string& strategy, const std::string& banner) {
  const std::string& tag = strategy;
  ScratchDir ddp(tag + ".ddp"), sharded(tag + ".sharded"), resumed(tag + ".resumed"), plain(tag + ".plain");
  auto with = [&](std::vector<std::string> args, bool on) {
    args.push_back("distributed.strategy=" + (on ? strategy : std::string("allreduce")));
    args.push_back("training.grad_clip=0.05");  // below the run's norms: every step clips
    args.push_back("data.num_classes=4");
    return args;
  };
  RunResult a = train(config_path("mlp_synthetic.yaml"), with(parity_args(ddp, 16, 1), false), 2);
  ASSERT_EQ(a.exit_code, 0) << a.output;
  RunResult b = train(config_path("mlp_synthetic.yaml"), with(parity_args(sharded, 16, 1), true), 2);
  ASSERT_EQ(b.exit_code, 0) << b.output;
  EXPECT_NE(b.output.find(banner), std::string::npos) << b.output;
  expect_close_history(read_metrics(ddp.file("run/metrics.jsonl")), read_metrics(sharded.file("run/metrics.jsonl")),
                       20);
  for (const ScratchDir* dir : {&resumed, &plain}) {
    fs::copy(sharded.file("run"), dir->file("run"), fs::copy_options::recursive);
    fs::remove_all(dir->file("run/step_00000020"));
  }
  RunResult c = train(config_path("mlp_synthetic.yaml"), with(parity_args(resumed, 16, 1), true), 2);
  ASSERT_EQ(c.exit_code, 0) << c.output;
  EXPECT_NE(c.output.find("at step 10"), std::string::npos) << c.output;
  expect_same_history(read_metrics(sharded.file("run/metrics.jsonl")),
                      read_metrics(resumed.file("run/metrics.jsonl")), 20);
  RunResult d = train(config_path("mlp_synthetic.yaml"), with(parity_args(plain, 16, 1), false), 2);
  ASSERT_EQ(d.exit_code, 0) << d.output;
  EXPECT_NE(d.output.find("at step 10"), std::string::npos) << d.output;
  expect_close_history(read_metrics(sharded.file("run/metrics.jsonl")), read_metrics(plain.file("run/metrics.jsonl")),
                       20);
}

TEST(TrainDistributed, ZeroShardedOptimizerMatchesDdpAndItsCheckpointsResumeEitherWay) {
  expect_sharded_run_matches_ddp_and_resumes_either_way("zero", "optimizer sharded (ZeRO-1)");
}

TEST(TrainDistributed, GatheredGradientsMatchDdpAndTheirCheckpointsResumeEitherWay) {
  expect_sharded_run_matches_ddp_and_resumes_either_way("gathered_grads",
                                                        "optimizer sharded (ZeRO-1 from gathered layer inputs)");
}

// distributed.strategy auto names what it chose and why in the run's first lines: on CPUs the plain
// all-reduce; on two GPUs an MLP's gradients from gathered layer inputs and a large GPT's ZeRO-1 on the
// copy engines, each step replayed from a CUDA graph.
TEST(TrainStrategy, AutoSaysWhatItChoseAndWhyOnCpus) {
  ScratchDir dir("strategy.cpu");
  RunResult r = train(config_path("mlp_synthetic.yaml"), parity_args(dir, 16, 1), 2);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("exchange allreduce (distributed.strategy auto: on CPUs)"), std::string::npos) << r.output;
}

TEST(TrainStrategy, AutoShardsAnMlpOnTwoGpusAndReplaysTheStep) {
  if (!cuda::is_available() || cuda::device_count() < 2) GTEST_SKIP() << "needs 2 CUDA devices";
  ScratchDir dir("strategy.gpu");
  std::vector<std::string> args = parity_args(dir, 16, 1);
  args[0] = "training.device=cuda";
  args.push_back("data.num_classes=4");
  RunResult r = train(config_path("mlp_synthetic.yaml"), args, 2);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("exchange gathered_grads on the copy engines (distributed.strategy auto: an MLP"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("steps   replayed from a CUDA graph"), std::string::npos) << r.output;
}

// Under bf16 each rank's float32 masters are current only for its own shard; a checkpoint must hold them
// whole (gather_targets), or the resumed run starts from stale weights.
void expect_bf16_checkpoints_resume_exactly(const std::string& strategy) {
  const std::string tag = strategy + ".bf16";
  ScratchDir full(tag + ".full"), resumed(tag + ".resumed");
  auto args = [&](const ScratchDir& dir) {
    std::vector<std::string> a = parity_args(dir, 16, 1);
    a.insert(a.end(), {"training.precision=bf16", "distributed.strategy=" + strategy, "data.num_classes=4"});
    return a;
  };
  RunResult a = train(config_path("mlp_synthetic.yaml"), args(full), 2);
  ASSERT_EQ(a.exit_code, 0) << a.output;
  EXPECT_NE(a.output.find("bf16 (float32 masters)"), std::string::npos) << a.output;
  fs::copy(full.file("run"), resumed.file("run"), fs::copy_options::recursive);
  fs::remove_all(resumed.file("run/step_00000020"));
  RunResult b = train(config_path("mlp_synthetic.yaml"), args(resumed), 2);
  ASSERT_EQ(b.exit_code, 0) << b.output;
  EXPECT_NE(b.output.find("at step 10"), std::string::npos) << b.output;
  expect_same_history(read_metrics(full.file("run/metrics.jsonl")), read_metrics(resumed.file("run/metrics.jsonl")),
                      20);
}

TEST(TrainDistributed, ZeroBf16CheckpointsHoldTheWholeMastersAndResumeExactly) {
  expect_bf16_checkpoints_resume_exactly("zero");
}

TEST(TrainDistributed, GatheredBf16CheckpointsHoldTheWholeMastersAndResumeExactly) {
  expect_bf16_checkpoints_resume_exactly("gathered_grads");
}

// Gathered-input gradients on two GPUs. In float32, close to plain DDP (every step clipped; bf16 would
// round the two ways of forming dW differently). In bf16, the graph (the layer-input and output-gradient
// all-gathers and the row GEMMs on the update stream) with every all-gather on the copy engines reproduces
// the eager run on NCCL's kernels exactly (a gather copies bytes), with the trainer stepping the shards
// outside it.
TEST(TrainCudaGraph, TwoGpusUnderGatheredGradientsMatchDdpAndReproduceTheEagerRunExactly) {
  if (!cuda::is_available() || cuda::device_count() < 2) GTEST_SKIP() << "needs 2 CUDA devices";
  ScratchDir ddp("graph.gathered.ddp"), fp32("graph.gathered.fp32"), eager("graph.gathered.eager"),
      graph("graph.gathered.graph");
  auto args = [](const ScratchDir& dir, const std::string& precision, bool gathered, bool in_graph) {
    std::vector<std::string> a = parity_args(dir, 16, 1);
    a[0] = "training.device=cuda";
    a.insert(a.end(), {"data.num_classes=4", "training.grad_clip=0.05", "training.precision=" + precision,
                       std::string("distributed.strategy=") + (gathered ? "gathered_grads" : "allreduce"),
                       std::string("training.cuda_graph=") + (in_graph ? "true" : "false")});
    return a;
  };
  RunResult a = train(config_path("mlp_synthetic.yaml"), args(ddp, "fp32", false, false), 2);
  ASSERT_EQ(a.exit_code, 0) << a.output;
  RunResult b = train(config_path("mlp_synthetic.yaml"), args(fp32, "fp32", true, false), 2);
  ASSERT_EQ(b.exit_code, 0) << b.output;
  expect_close_history(read_metrics(ddp.file("run/metrics.jsonl")), read_metrics(fp32.file("run/metrics.jsonl")), 20);
  std::vector<std::string> on_kernels = args(eager, "bf16", true, false), on_engines = args(graph, "bf16", true, true);
  on_kernels.push_back("distributed.copy_engines=false");
  on_engines.push_back("distributed.copy_engines=true");
  RunResult c = train(config_path("mlp_synthetic.yaml"), on_kernels, 2);
  ASSERT_EQ(c.exit_code, 0) << c.output;
  RunResult d = train(config_path("mlp_synthetic.yaml"), on_engines, 2);
  ASSERT_EQ(d.exit_code, 0) << d.output;
  EXPECT_NE(d.output.find("from gathered layer inputs, exchanged by the copy engines"), std::string::npos) << d.output;
  expect_same_history(read_metrics(eager.file("run/metrics.jsonl")), read_metrics(graph.file("run/metrics.jsonl")),
                      20);
}

// --- failures ----------------------------------------------------------------------------------

TEST(TrainFailures, NonFiniteStepsAreSkippedWithAWarningThenTheRunStops) {
  ScratchDir dir("nonfinite");
  // SGD at lr 100 on a regression overflows to inf within a few steps; skipped steps change nothing,
  // so the loss stays inf until the budget of bad steps is spent.
  RunResult r = train(config_path("mlp_synthetic.yaml"),
                      {"training.device=cpu", "data.kind=synthetic_regression", "data.num_features=8", "optim.kind=sgd",
                       "optim.lr=100", "training.grad_clip=0", "schedule.kind=constant", "training.max_bad_steps=2",
                       "logging.every=100", "checkpoint.dir=" + dir.file("run")});
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("update skipped (1 of at most 2)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("exceed training.max_bad_steps (2)"), std::string::npos) << r.output;
  int skipped = 0;
  for (const auto& rec : train_records(read_metrics(dir.file("run/metrics.jsonl")))) skipped += rec.skipped;
  EXPECT_EQ(skipped, 3);
  EXPECT_FALSE(fs::exists(dir.file("run/step_00000600")));
}

// The same on a GPU without clipping, where each update runs before its step is decided: AdamW at lr 100 with
// weight decay 1 multiplies every weight by -99 a step until the loss overflows, and every skipped update is
// undone (the loss stays inf).
TEST(TrainFailures, CudaNonFiniteStepsAreSkippedWhenTheUpdateRunsBeforeItsDecision) {
  if (!cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  ScratchDir dir("nonfinite.speculative");
  RunResult r =
      train(config_path("mlp_synthetic.yaml"),
            {"training.device=cuda", "data.kind=synthetic_regression", "data.num_features=8", "optim.kind=adamw",
             "optim.lr=100", "optim.weight_decay=1", "training.grad_clip=0", "schedule.kind=constant",
             "training.max_bad_steps=2", "logging.every=1", "checkpoint.dir=" + dir.file("run")});
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("update  applied before its decision"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("exceed training.max_bad_steps (2)"), std::string::npos) << r.output;
  int skipped = 0;
  for (const auto& rec : train_records(read_metrics(dir.file("run/metrics.jsonl")))) skipped += rec.skipped;
  EXPECT_EQ(skipped, 3);
}

// The same under ZeRO-1 on two processes: the ranks' shares of the norm are summed and every rank's sharded
// update reads the same skip, so no rank updates or all-gathers on a skipped step. Here the loss overflows
// while the gradient norm is still finite (about 1e35): had a skipped step updated, the next step's
// parameters, and so its norm, would no longer be finite.
TEST(TrainFailures, NonFiniteStepsAreSkippedByEveryRankOfAShardedRun) {
  ScratchDir dir("nonfinite.zero");
  RunResult r = train(config_path("mlp_synthetic.yaml"),
                      {"training.device=cpu", "data.kind=synthetic_regression", "data.num_features=8", "optim.kind=sgd",
                       "optim.lr=100", "training.grad_clip=0", "schedule.kind=constant", "training.max_bad_steps=2",
                       "distributed.strategy=zero", "logging.every=100", "checkpoint.dir=" + dir.file("run")},
                      2);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("update skipped (1 of at most 2)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("exceed training.max_bad_steps (2)"), std::string::npos) << r.output;
  int skipped = 0;
  for (const auto& rec : train_records(read_metrics(dir.file("run/metrics.jsonl")))) {
    skipped += rec.skipped;
    if (rec.skipped) {
      // A non-finite number is written as null, which strtod reads as 0.
      const double norm = std::strtod(rec.grad_norm.c_str(), nullptr);
      EXPECT_TRUE(std::isfinite(norm) && norm > 0) << rec.line;
    }
  }
  EXPECT_EQ(skipped, 3);
}

TEST(TrainFailures, CheckpointsOfAnotherModelAreRefusedAndLeftUntouched) {
  ScratchDir dir("othermodel");
  std::vector<std::string> args = {"training.device=cpu", "model.mlp.hidden=[16]", "training.steps=4",
                                   "schedule.warmup_steps=1", "checkpoint.dir=" + dir.file("run")};
  ASSERT_EQ(train(config_path("mlp_synthetic.yaml"), args).exit_code, 0);
  const auto before = snapshot(dir.file("run"));
  for (const char* resume : {"auto", "never"}) {
    std::vector<std::string> other = args;
    other[1] = "model.mlp.hidden=[8]";
    other.push_back(std::string("checkpoint.resume=") + resume);
    RunResult r = train(config_path("mlp_synthetic.yaml"), other);
    EXPECT_EQ(r.exit_code, 1) << r.output;
    EXPECT_NE(r.output.find("a different model"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("'0.weight' is float32 [16, 2] there but float32 [8, 2]"), std::string::npos) << r.output;
    EXPECT_EQ(snapshot(dir.file("run")), before) << "a refused run changed the run directory";
  }
}

TEST(TrainFailures, CheckpointsOfAnotherWorldSizeAreRefused) {
  ScratchDir dir("otherworld");
  std::vector<std::string> args = {"training.device=cpu",    "model.mlp.hidden=[16]",
                                   "training.steps=4",       "schedule.warmup_steps=1",
                                   "training.batch_size=16", "checkpoint.dir=" + dir.file("run")};
  ASSERT_EQ(train(config_path("mlp_synthetic.yaml"), args).exit_code, 0);
  const auto before = snapshot(dir.file("run"));
  RunResult r = train(config_path("mlp_synthetic.yaml"), args, /*nproc=*/2);
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("world size 1, this one has 2"), std::string::npos) << r.output;
  EXPECT_EQ(snapshot(dir.file("run")), before);
}

// Gathered gradients give each rank an equal block of every layer's rows: 3 classes on 2 processes is an
// error on every rank naming the switch and the layer, and the run directory is not created.
TEST(TrainFailures, GatheredGradientsWithRowsThatDoNotSplitAreRefusedAndWriteNothing) {
  ScratchDir dir("gathered.rows");
  RunResult r = train(config_path("mlp_synthetic.yaml"),
                      {"training.device=cpu", "model.mlp.hidden=[16]", "training.steps=4", "schedule.warmup_steps=1",
                       "data.num_classes=3", "distributed.strategy=gathered_grads", "checkpoint.dir=" + dir.file("run")},
                      /*nproc=*/2);
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("distributed.strategy gathered_grads: GatheredLinearZero: Linear '2' has 3 output features, not "
                          "divisible by the world size 2"),
            std::string::npos)
      << r.output;
  EXPECT_FALSE(fs::exists(dir.file("run")));
}

TEST(TrainFailures, AnInvalidConfigIsOneMessageAndWritesNothing) {
  ScratchDir dir("invalid");
  RunResult r = train(config_path("mlp_synthetic.yaml"), {"model.mlp.hiden=[3]", "checkpoint.dir=" + dir.file("run")});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("did you mean 'model.mlp.hidden'"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(dir.file("run")));
  RunResult missing = train(dir.file("nope.yaml"), {});
  EXPECT_EQ(missing.exit_code, 1);
  EXPECT_NE(missing.output.find("does not exist"), std::string::npos) << missing.output;
}

}  // namespace
}  // namespace dpt::train
