// What the README shows, run as the README shows it: scripts/train.sh trains the default config to a
// visibly lower loss, scripts/plot-metrics.sh turns its metrics into a PNG (or skips cleanly without
// gnuplot), and docs/config-reference.md is the reference the code generates. The bar of
// scripts/gpu-convergence.sh is checked on loss curves of known distances (its table needs no GPU).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "config.h"
#include "core/flags.h"
#include "train_test_util.h"

namespace dpt::train {
namespace {

namespace fs = std::filesystem;
using namespace test_util;

const std::string kSource = DPT_SOURCE_DIR;

TEST(ReadmeCommands, TrainShTrainsTheDefaultConfigToAVisiblyLowerLoss) {
  ScratchDir dir("train_sh");
  // The README's first command with the build step skipped (the test suite runs after the build).
  RunResult r =
      run_shell("cd " + quote(dir.path().string()) + " && DPT_SKIP_BUILD=1 DPT_BUILD_DIR=" + quote(DPT_BINARY_DIR) +
                " " + quote(kSource + "/scripts/train.sh"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto records = read_metrics(dir.file("runs/mlp_synthetic/metrics.jsonl"));
  auto steps = train_records(records);
  ASSERT_GE(steps.size(), 2u) << r.output;
  const double first = number(steps.front().loss), last = number(steps.back().loss);
  EXPECT_GT(first, 1.0);         // three classes at chance: ln 3 = 1.10
  EXPECT_LT(last, first / 4.0);  // the spirals are learned
  auto evals = eval_records(records);
  ASSERT_FALSE(evals.empty());
  EXPECT_LT(number(evals.back().val_loss), 0.25);
  EXPECT_NE(r.output.find("validation loss"), std::string::npos);
}

TEST(ReadmeCommands, PlotMetricsDrawsAPngOrSkipsCleanlyWithoutGnuplot) {
  ScratchDir dir("plot");
  const std::string metrics = dir.file("metrics.jsonl");
  {
    std::ofstream out(metrics);
    for (int step = 1; step <= 20; ++step) {
      out << "{\"type\": \"train\", \"step\": " << step << ", \"loss\": " << 2.0 / step
          << ", \"lr\": 0.001, \"grad_norm\": 1, \"skipped\": false}\n";
      if (step % 10 == 0) out << "{\"type\": \"eval\", \"step\": " << step << ", \"val_loss\": " << 2.5 / step << "}\n";
    }
  }
  const std::string png = dir.file("loss.png");
  RunResult r = run_shell(quote(kSource + "/scripts/plot-metrics.sh") + " " + quote(metrics) + " " + quote(png));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const bool have_gnuplot = run_shell("command -v gnuplot").exit_code == 0;
  if (have_gnuplot) {
    const std::string bytes = read_text(png);
    ASSERT_GE(bytes.size(), 8u) << r.output;
    EXPECT_EQ(bytes.substr(1, 3), "PNG") << r.output;
  } else {
    EXPECT_NE(r.output.find("gnuplot is not installed"), std::string::npos) << r.output;
    EXPECT_FALSE(fs::exists(png));
  }
  // A file with no training records is an error, not an empty plot.
  std::ofstream(dir.file("empty.jsonl")) << "\n";
  if (have_gnuplot) {
    EXPECT_NE(run_shell(quote(kSource + "/scripts/plot-metrics.sh") + " " + quote(dir.file("empty.jsonl")) + " " +
                        quote(dir.file("e.png")))
                  .exit_code,
              0);
  }
}

// One combination's files as gpu-convergence.sh leaves them: dptrain's JSON line, then PyTorch's reference
// line and one line for each floor run, each with its losses.
void write_losses(const ScratchDir& dir, const std::string& tag, const std::vector<double>& dptrain,
                  const std::vector<double>& reference, const std::vector<std::vector<double>>& floors) {
  auto list = [](const std::vector<double>& v) {
    std::ostringstream s;
    s.precision(17);
    s << '[';
    for (size_t i = 0; i < v.size(); ++i) s << (i ? ", " : "") << v[i];
    s << ']';
    return s.str();
  };
  std::ofstream(dir.file("convergence/" + tag + ".dptrain.jsonl"))
      << "{\"system\": \"dptrain\", \"losses\": " << list(dptrain) << "}\n";
  std::ofstream torch(dir.file("convergence/" + tag + ".pytorch.jsonl"));
  torch << "{\"system\": \"pytorch-eager\", \"role\": \"reference\", \"losses\": " << list(reference) << "}\n";
  for (size_t i = 0; i < floors.size(); ++i)
    torch << "{\"system\": \"pytorch-eager-floor" << i << "\", \"role\": \"floor-" << i
          << "\", \"losses\": " << list(floors[i]) << "}\n";
}

std::vector<double> scaled(const std::vector<double>& v, double by, int only_step = -1) {
  std::vector<double> out = v;
  for (size_t i = 0; i < out.size(); ++i)
    if (only_step < 0 || static_cast<int>(i) == only_step) out[i] *= by;
  return out;
}

TEST(GpuConvergenceTable, PassesWithinTwiceThePyTorchFloorAndFailsPastIt) {
  if (run_shell("command -v python3").exit_code != 0) GTEST_SKIP() << "python3 is not installed";
  ScratchDir dir("convergence");
  fs::create_directories(dir.file("convergence"));
  const std::vector<double> ref = {10, 9, 8, 7, 6};
  const std::vector<double> floor = scaled(ref, 1 + 1e-4);  // PyTorch 1e-4 from itself at every step
  // Within the bar: 1.5e-4 <= 2 x 1e-4 + 1e-6 at every step.
  write_losses(dir, "near", scaled(ref, 1 + 1.5e-4), ref, {floor});
  // Over it at step 3 only: 3e-4 > 2 x 1e-4 + 1e-6.
  write_losses(dir, "far", scaled(ref, 1 + 3e-4, 3), ref, {floor});
  const std::string script = quote(kSource + "/scripts/gpu-convergence.sh") + " --table-only";
  const std::string env = "OUT=" + quote(dir.path().string()) + " ";
  auto manifest = [&](const std::string& rows) { std::ofstream(dir.file("convergence/combinations.tsv")) << rows; };
  const std::string near = "near\tmlp_92m\tfp32\t1\trepeat\t5\tcpu\trun\t\n";
  const std::string skipped = "wide\tmlp_92m\tfp32\t2\trepeat\t5\tcpu\tskipped\tneeds 2 GPUs, 1 visible\n";

  manifest(near + skipped);
  RunResult pass = run_shell(env + script);
  EXPECT_EQ(pass.exit_code, 0) << pass.output;
  EXPECT_NE(pass.output.find("1.49   PASS"), std::string::npos) << pass.output;  // 1.5e-4 / (1e-4 + 5e-7)
  EXPECT_NE(pass.output.find("SKIPPED"), std::string::npos) << pass.output;
  EXPECT_NE(pass.output.find("convergence: PASS"), std::string::npos) << pass.output;

  manifest(near + "far\tmlp_92m\tbf16\t1\trandom\t5\tcpu\trun\t\n" + skipped);
  RunResult fail = run_shell(env + script);
  EXPECT_EQ(fail.exit_code, 1) << fail.output;
  EXPECT_NE(fail.output.find("far: first step over the bar 3"), std::string::npos) << fail.output;
  EXPECT_NE(fail.output.find("convergence: FAIL: 1 within the bar, 1 over it"), std::string::npos) << fail.output;
  // The per-step curves: a header and one row per step, the bar from the running maxima.
  std::istringstream csv(read_text(dir.file("convergence/far.csv")));
  std::vector<std::string> lines;
  for (std::string line; std::getline(csv, line);) lines.push_back(line);
  ASSERT_EQ(lines.size(), 6u) << read_text(dir.file("convergence/far.csv"));
  EXPECT_EQ(lines[0], "step,dptrain_loss,pytorch_loss,floor_loss,gap,floor,gap_max,floor_max,bar");
  EXPECT_EQ(lines[4].substr(0, 2), "3,");

  // A combination whose PyTorch run printed nothing is no pass.
  fs::remove(dir.file("convergence/near.pytorch.jsonl"));
  manifest(near);
  RunResult missing = run_shell(env + script);
  EXPECT_EQ(missing.exit_code, 1) << missing.output;
  EXPECT_NE(missing.output.find("NO RESULT"), std::string::npos) << missing.output;
  EXPECT_NE(missing.output.find("no losses from PyTorch, floor run"), std::string::npos) << missing.output;
}

// Several floor runs: the floor at each step is the one farthest from the reference there, so dptrain's
// gap at step 3 is judged against the run that strayed most by then, not against the first run alone.
TEST(GpuConvergenceTable, TheFloorIsTheFarthestOfSeveralPyTorchRunsAtEachStep) {
  if (run_shell("command -v python3").exit_code != 0) GTEST_SKIP() << "python3 is not installed";
  ScratchDir dir("convergence_floors");
  fs::create_directories(dir.file("convergence"));
  const std::vector<double> ref = {10, 9, 8, 7, 6};
  const std::vector<double> near = scaled(ref, 1 + 1e-5);       // 1e-5 from the reference at every step
  const std::vector<double> strays = scaled(ref, 1 + 3e-4, 3);  // 3e-4 at step 3 only
  const std::vector<double> ours = scaled(ref, 1 + 5e-4, 3);    // 5e-4 at step 3: over 2 x 1e-5, within 2 x 3e-4
  const std::string script = quote(kSource + "/scripts/gpu-convergence.sh") + " --table-only";
  const std::string env = "OUT=" + quote(dir.path().string()) + " ";
  std::ofstream(dir.file("convergence/combinations.tsv"))
      << "both\tmlp_92m\tfp32\t1\trepeat\t5\tcpu,order\trun\t\nfirst\tmlp_92m\tfp32\t1\trepeat\t5\tcpu\trun\t\n";
  write_losses(dir, "both", ours, ref, {strays, near});
  write_losses(dir, "first", ours, ref, {near});
  RunResult r = run_shell(env + script);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_EQ(r.output.find("both: first step over the bar"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("first: first step over the bar 3"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("convergence: FAIL: 1 within the bar, 1 over it"), std::string::npos) << r.output;
  // The curve names the farthest floor run's loss at each step: the straying run's at step 3.
  std::istringstream csv(read_text(dir.file("convergence/both.csv")));
  std::vector<std::string> lines;
  for (std::string line; std::getline(csv, line);) lines.push_back(line);
  ASSERT_EQ(lines.size(), 6u);
  EXPECT_EQ(lines[4].substr(0, 7), "3,7.003") << lines[4];            // step 3, dptrain 7 x (1 + 5e-4)
  EXPECT_NE(lines[4].find(",7.002"), std::string::npos) << lines[4];  // the floor loss: 7 x (1 + 3e-4)
}

// The table names a long list of floor runs briefly: consecutive seeds of one kind as a range.
TEST(GpuConvergenceTable, ConsecutiveFloorSeedsAreShownAsARange) {
  if (run_shell("command -v python3").exit_code != 0) GTEST_SKIP() << "python3 is not installed";
  ScratchDir dir("convergence_range");
  fs::create_directories(dir.file("convergence"));
  const std::vector<double> ref = {10, 9, 8};
  std::ofstream(dir.file("convergence/combinations.tsv"))
      << "many\tmlp_92m\tfp32\t1\trepeat\t3\tcpu,order:1,order:2,units:1,units:2,units:3,units:4,units:6\trun\t\n";
  write_losses(dir, "many", ref, ref, std::vector<std::vector<double>>(7, scaled(ref, 1 + 1e-4)));
  RunResult r = run_shell("OUT=" + quote(dir.path().string()) + " " + quote(kSource + "/scripts/gpu-convergence.sh") +
                          " --table-only");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find(" cpu,order:1,order:2,units:1-4,units:6 "), std::string::npos) << r.output;
}

// Floor kinds are checked before anything runs: a units floor names an MLP's units, so a GPT is refused,
// the flash floor changes a GPT's bf16 attention, so an MLP and fp32 are refused, and a kind outside the
// list is named.
TEST(GpuConvergenceSettings, FloorKindsAreCheckedBeforeAnythingRuns) {
  const std::string script = quote(kSource + "/scripts/gpu-convergence.sh");
  auto expect_refused = [&](const std::string& settings, const std::string& message) {
    RunResult r = run_shell(settings + " " + script);
    EXPECT_EQ(r.exit_code, 2) << settings << "\n" << r.output;
    EXPECT_NE(r.output.find(message), std::string::npos) << settings << "\n" << r.output;
  };
  expect_refused("DPT_CONV_WORKLOADS=tiny_gpt DPT_CONV_PRECISIONS=fp32 DPT_CONV_FLOOR_FP32=cpu,units:1",
                 "the units floor permutes an MLP's units, not tiny_gpt's");
  expect_refused("DPT_CONV_WORKLOADS=mlp_92m DPT_CONV_PRECISIONS=bf16 DPT_CONV_FLOOR_BF16=compile,order:x",
                 "unknown floor 'order:x' for mlp_92m bf16");
  expect_refused("DPT_CONV_WORKLOADS=mlp_92m DPT_CONV_PRECISIONS=bf16 DPT_CONV_FLOOR_BF16=compile,flash",
                 "the flash floor changes a GPT's attention; mlp_92m has none");
  expect_refused("DPT_CONV_WORKLOADS=tiny_gpt DPT_CONV_PRECISIONS=fp32 DPT_CONV_FLOOR_FP32=cpu,flash",
                 "the flash floor runs PyTorch's bf16 attention kernels, not fp32 (tiny_gpt)");
}

// A workload is any configs/bench_NAME.yaml; a name without one is refused before anything runs.
TEST(GpuConvergenceSettings, AWorkloadIsABenchConfig) {
  const std::string script = quote(kSource + "/scripts/gpu-convergence.sh");
  RunResult r = run_shell("DPT_CONV_WORKLOADS='tiny_gpt resnet' " + script);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("unknown workload 'resnet' in DPT_CONV_WORKLOADS (no configs/bench_resnet.yaml)"),
            std::string::npos)
      << r.output;
  EXPECT_EQ(r.output.find("tiny_gpt'"), std::string::npos) << r.output;
}

// --plan lists what the settings would run, nothing run (no build, no PyTorch needed): a GPT's bf16 floor takes
// PyTorch's flash attention, and 16 random orders with a repeated batch, where training turns chaotic; an
// MLP's takes unit permutations and no attention backend.
TEST(GpuConvergenceSettings, PlanNamesEachCombinationsFloorRuns) {
  const std::string script = quote(kSource + "/scripts/gpu-convergence.sh");
  RunResult r = run_shell("DPT_CONV_WORKLOADS='tiny_gpt mlp_92m' DPT_CONV_PRECISIONS='bf16 fp32' DPT_CONV_GPUS=1 " +
                          script + " --plan");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::string orders16;
  for (int seed = 1; seed <= 16; ++seed) orders16 += ",order:" + std::to_string(seed);
  EXPECT_NE(r.output.find("tiny_gpt_bf16_1gpu_repeat: compile,kernels,flash,order" + orders16 + "\n"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("tiny_gpt_bf16_1gpu_random: compile,kernels,flash,order,order:1,order:2\n"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("tiny_gpt_fp32_1gpu_repeat: cpu,order,order:1,order:2\n"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("mlp_92m_bf16_1gpu_repeat: compile,kernels,order,order:1,order:2,units:1,"),
            std::string::npos)
      << r.output;
  EXPECT_EQ(r.output.find("2gpu"), std::string::npos) << r.output;
  EXPECT_EQ(run_shell(script + " --plan --table-only").exit_code, 2);
}

TEST(GpuConvergenceTable, ANullLossFromDptBenchIsInfinitelyFarNotACrash) {
  if (run_shell("command -v python3").exit_code != 0) GTEST_SKIP() << "python3 is not installed";
  ScratchDir dir("convergence_null");
  fs::create_directories(dir.file("convergence"));
  const std::vector<double> ref = {10, 9, 8, 7, 6};
  write_losses(dir, "diverged", ref, ref, {scaled(ref, 1 + 1e-4)});
  // dpt-bench writes a non-finite loss as null (JSON has no NaN): here at step 2.
  std::ofstream(dir.file("convergence/diverged.dptrain.jsonl"))
      << "{\"system\": \"dptrain\", \"losses\": [10, 9, null, 7, 6]}\n";
  std::ofstream(dir.file("convergence/combinations.tsv")) << "diverged\tmlp_92m\tfp32\t1\trepeat\t5\tcpu\trun\t\n";
  RunResult r = run_shell("OUT=" + quote(dir.path().string()) + " " + quote(kSource + "/scripts/gpu-convergence.sh") +
                          " --table-only");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("diverged: first step over the bar 2"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("Traceback"), std::string::npos) << r.output;
}

// scripts/gpu-scaling.sh's table from an earlier run's files: PyTorch DDP ran in three modes, and each of
// dptrain's ratios is against the fastest mode at that count (compile at one GPU, eager at two, CUDA graphs
// at four).
TEST(GpuScalingTable, RatiosAreAgainstPyTorchsFastestModeAtEachCount) {
  if (run_shell("command -v python3").exit_code != 0) GTEST_SKIP() << "python3 is not installed";
  ScratchDir dir("scaling_table");
  fs::create_directories(dir.file("scaling/mlp_92m"));
  std::ofstream(dir.file("scaling/mlp_92m/scaling.csv"))
      << "gpus,bucket_cap_mb,throughput_per_gpu,efficiency_pct\n1,25,400,100\n2,25,380,95\n4,25,360,90\n";
  std::ofstream(dir.file("scaling/dpt-train.jsonl"))
      << "{\"workload\": \"mlp_92m\", \"world\": 1, \"throughput\": 300}\n"
         "{\"workload\": \"mlp_92m\", \"world\": 2, \"throughput\": 290}\n"
         "{\"workload\": \"mlp_92m\", \"world\": 4, \"throughput\": 280}\n";
  std::ofstream(dir.file("scaling/pytorch.jsonl"))
      << "{\"system\": \"pytorch-eager\", \"workload\": \"mlp_92m\", \"world\": 1, \"throughput\": 100}\n"
         "{\"system\": \"pytorch-eager+ddp\", \"workload\": \"mlp_92m\", \"world\": 2, \"throughput\": 90}\n"
         "{\"system\": \"pytorch-eager+ddp\", \"workload\": \"mlp_92m\", \"world\": 4, \"throughput\": 80}\n"
         "{\"system\": \"pytorch-compile\", \"workload\": \"mlp_92m\", \"world\": 1, \"throughput\": 200}\n"
         "{\"system\": \"pytorch-compile+ddp\", \"workload\": \"mlp_92m\", \"world\": 2, \"throughput\": 60}\n"
         "{\"system\": \"pytorch-compile-reduce-overhead+ddp\", \"workload\": \"mlp_92m\", \"world\": 4, "
         "\"throughput\": 100}\n";
  RunResult r = run_shell("OUT=" + quote(dir.path().string()) + " " + quote(kSource + "/scripts/gpu-scaling.sh") +
                          " --table-only");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("1 -> 2 -> 4 GPUs"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("pytorch-compile DDP"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("pytorch-graphs DDP"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("30.0%"), std::string::npos) << r.output;  // compile's own efficiency at two: 60 / 200
  // 400 / 200, 380 / 90, 360 / 100; and dpt-train's 300 / 200, 290 / 90, 280 / 100.
  EXPECT_NE(r.output.find("dpt-bench / PyTorch       2.00x       4.22x       3.60x"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("dpt-train / PyTorch       1.50x       3.22x       2.80x"), std::string::npos) << r.output;

  RunResult none = run_shell("OUT=" + quote(dir.file("nothing")) + " " + quote(kSource + "/scripts/gpu-scaling.sh") +
                             " --table-only");
  EXPECT_EQ(none.exit_code, 2) << none.output;
  EXPECT_NE(none.output.find("no earlier run"), std::string::npos) << none.output;
}

TEST(ConfigReferenceDocument, MatchesTheReferenceTheCodeGenerates) {
  const std::string doc = read_text(kSource + "/docs/config-reference.md");
  const auto table = doc.find("| key |");
  ASSERT_NE(table, std::string::npos) << "docs/config-reference.md has no table";
  EXPECT_EQ(doc.substr(table), config_reference())
      << "docs/config-reference.md is out of date: run scripts/gen-config-reference.sh";
  for (const auto& key : config_keys()) EXPECT_NE(doc.find("`" + key + "`"), std::string::npos) << key;
}

TEST(EnvironmentDocument, MatchesTheFlagTableTheCodeGenerates) {
  const std::string doc = read_text(kSource + "/docs/environment.md");
  const auto table = doc.find("| variable |");
  ASSERT_NE(table, std::string::npos) << "docs/environment.md has no table";
  EXPECT_EQ(doc.substr(table), dpt::environment_reference())
      << "docs/environment.md is out of date: run scripts/gen-config-reference.sh";
}

TEST(ReadmeCommands, TheReadmeOpensWithTheTwoCommandsAndNamesOnlyFilesThatExist) {
  const std::string readme = read_text(kSource + "/README.md");
  const auto block = readme.find("```sh\n");
  ASSERT_NE(block, std::string::npos);
  const std::string first = readme.substr(block + 6, readme.find("```", block + 6) - block - 6);
  std::vector<std::string> commands;
  std::istringstream lines(first);
  for (std::string line; std::getline(lines, line);) commands.push_back(line.substr(0, line.find(" #")));
  ASSERT_EQ(commands.size(), 2u) << first;
  EXPECT_EQ(commands[0].substr(0, commands[0].find_last_not_of(' ') + 1), "./scripts/train.sh");
  EXPECT_EQ(commands[1].substr(0, commands[1].find_last_not_of(' ') + 1), "./scripts/test.sh");
  // Every config, script and source file the README names is in the tree.
  const std::regex path(
      R"((configs|scripts|layers|tests|docs|bench|apps|distributed)/[A-Za-z0-9_./-]+\.(yaml|sh|h|cpp|md|py))");
  for (auto it = std::sregex_iterator(readme.begin(), readme.end(), path); it != std::sregex_iterator(); ++it) {
    EXPECT_TRUE(fs::exists(kSource + "/" + it->str())) << "README names a missing file: " << it->str();
  }
  EXPECT_NE(readme.find("## Performance"), std::string::npos);
  // A front door: short, and everything it points to is in the repository.
  EXPECT_LE(std::count(readme.begin(), readme.end(), '\n'), 150) << "README.md is longer than 150 lines";
}

TEST(Docs, NameOnlyFilesThatExistAndLinkNothingOutsideTheRepository) {
  const std::regex path(
      R"((configs|scripts|layers|tests|docs|bench|apps|distributed|core|optim|data)/[A-Za-z0-9_./-]+\.(yaml|sh|h|cpp|cu|md|py|png))");
  std::vector<fs::path> pages{kSource + "/README.md"};
  for (const auto& entry : fs::directory_iterator(kSource + "/docs")) {
    if (entry.path().extension() == ".md") pages.push_back(entry.path());
  }
  for (const fs::path& page : pages) {
    const std::string text = read_text(page.string());
    EXPECT_EQ(text.find("http://"), std::string::npos) << page << " links outside the repository";
    EXPECT_EQ(text.find("https://"), std::string::npos) << page << " links outside the repository";
    for (auto it = std::sregex_iterator(text.begin(), text.end(), path); it != std::sregex_iterator(); ++it) {
      const std::string name = it->str();
      if (name.find('*') != std::string::npos) continue;
      EXPECT_TRUE(fs::exists(kSource + "/" + name)) << page.filename() << " names a missing file: " << name;
    }
  }
}

}  // namespace
}  // namespace dpt::train
