// scripts/plot-metrics.sh over several runs: one PNG, loss on top, the throughput below it when the runs
// logged it (the single-run command of the README is tested in scripts_test.cpp).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <utility>

#include "train_test_util.h"

namespace dpt::train {
namespace {

namespace fs = std::filesystem;
using namespace test_util;

const std::string kScript = quote(std::string(DPT_SOURCE_DIR) + "/scripts/plot-metrics.sh");

// Width and height of a PNG, from its IHDR chunk.
std::pair<uint32_t, uint32_t> png_size(const std::string& bytes) {
  auto big_endian = [&](size_t at) {
    uint32_t v = 0;
    for (size_t i = 0; i < 4; ++i) v = (v << 8) | static_cast<unsigned char>(bytes.at(at + i));
    return v;
  };
  return {big_endian(16), big_endian(20)};
}

bool have_gnuplot() { return run_shell("command -v gnuplot").exit_code == 0; }

// 20 training records in `dir`/metrics.jsonl, with throughput or without (as older files are).
void write_run(const std::string& dir, bool throughput) {
  fs::create_directories(dir);
  std::ofstream out(dir + "/metrics.jsonl");
  for (int step = 1; step <= 20; ++step) {
    out << "{\"type\": \"train\", \"step\": " << step << ", \"loss\": " << 2.0 / step
        << ", \"lr\": 0.001, \"grad_norm\": 1";
    if (throughput) {
      out << ", \"step_ms\": 2.000, \"throughput\": " << 1000 + 10 * step
          << ".0, \"throughput_per_gpu\": 500.0, \"unit\": \"tokens/s\", \"mfu\": null, \"elapsed_s\": 0.100";
    }
    out << ", \"skipped\": false}\n";
    if (step % 10 == 0) out << "{\"type\": \"eval\", \"step\": " << step << ", \"val_loss\": " << 2.5 / step << "}\n";
  }
}

TEST(PlotMetrics, ComparesRunsOnOnePngWithTheirThroughputBelowTheLoss) {
  ScratchDir dir("plot_runs");
  write_run(dir.file("lr_small"), true);
  write_run(dir.file("lr_large"), true);
  const std::string png = dir.file("compare.png");
  // Run directories and metrics files alike.
  RunResult r = run_shell(kScript + " " + quote(dir.file("lr_small")) + " " +
                          quote(dir.file("lr_large/metrics.jsonl")) + " " + quote(png));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  if (!have_gnuplot()) GTEST_SKIP() << "no gnuplot: " << r.output;
  const std::string bytes = read_text(png);
  ASSERT_GE(bytes.size(), 24u) << r.output;
  EXPECT_EQ(bytes.substr(1, 3), "PNG") << r.output;
  EXPECT_EQ(png_size(bytes), std::make_pair(900u, 900u));  // two panels
}

TEST(PlotMetrics, RunsWithoutThroughputGetTheLossPanelAlone) {
  ScratchDir dir("plot_no_speed");
  write_run(dir.file("a"), false);
  write_run(dir.file("b"), false);
  const std::string png = dir.file("loss.png");
  RunResult r = run_shell(kScript + " " + quote(dir.file("a")) + " " + quote(dir.file("b")) + " " + quote(png));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  if (!have_gnuplot()) GTEST_SKIP() << "no gnuplot: " << r.output;
  EXPECT_EQ(png_size(read_text(png)), std::make_pair(900u, 540u));
}

TEST(PlotMetrics, AMissingRunIsAnErrorNamingItAndNoRunIsUsage) {
  ScratchDir dir("plot_missing");
  write_run(dir.file("there"), true);
  RunResult missing = run_shell(kScript + " " + quote(dir.file("there")) + " " + quote(dir.file("gone")) + " " +
                                quote(dir.file("m.png")));
  EXPECT_EQ(missing.exit_code, 1);
  EXPECT_NE(missing.output.find("gone"), std::string::npos) << missing.output;
  EXPECT_FALSE(fs::exists(dir.file("m.png")));
  EXPECT_EQ(run_shell(kScript + " " + quote(dir.file("m.png"))).exit_code, 2);
}

}  // namespace
}  // namespace dpt::train
