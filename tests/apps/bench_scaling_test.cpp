// dpt-bench scaling end to end on the CPU (Gloo): it launches `dpt-bench train` through dpt-run at 1 and
// 2 processes and for a bucket sweep, and writes the CSV and Markdown tables with the step-time model.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "core/cuda_runtime.h"

namespace {

std::string read(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

TEST(BenchScaling, WritesWeakScalingTablesForOneAndTwoProcesses) {
  std::filesystem::path out = std::filesystem::temp_directory_path() / "dpt_bench_scaling_test";
  std::filesystem::remove_all(out);
  std::string cmd = std::string(DPT_BINARY_DIR) + "/bin/dpt-bench scaling --workload mlp_small --device cpu " +
                    "--max-gpus 2 --steps 3 --warmup 1 --bucket-sweep 1 --precision fp32 --out " + out.string() +
                    " > " + (out.string() + ".log") + " 2>&1";
  int status = std::system(cmd.c_str());
  ASSERT_EQ(status, 0) << read(out.string() + ".log");
  std::string csv = read(out / "scaling.csv");
  // Header, 1 and 2 processes at the default bucket size, and the sweep's one row at 2 processes.
  int lines = 0;
  for (char c : csv) lines += c == '\n';
  EXPECT_EQ(lines, 4) << csv;
  EXPECT_NE(csv.find("\n1,25,"), std::string::npos) << csv;
  EXPECT_NE(csv.find("\n2,25,"), std::string::npos) << csv;
  EXPECT_NE(csv.find("\n2,1,"), std::string::npos) << csv;
  std::string md = read(out / "scaling.md");
  EXPECT_NE(md.find("| GPUs | bucket MB |"), std::string::npos) << md;
  EXPECT_NE(md.find("predicted efficiency"), std::string::npos) << md;
  EXPECT_EQ(read(out.string() + ".log").find("(CUDA graph)"), std::string::npos);  // eager runs
  // The plot of those rows and the model's prediction: a PNG where gnuplot is installed, else a note.
  if (std::system("command -v gnuplot >/dev/null 2>&1") == 0) {
    EXPECT_EQ(read(out / "scaling.png").substr(0, 4), "\x89PNG") << read(out.string() + ".log");
  } else {
    EXPECT_NE(read(out.string() + ".log").find("gnuplot not installed"), std::string::npos);
    EXPECT_FALSE(std::filesystem::exists(out / "scaling.png"));
  }
  std::filesystem::remove_all(out);
}

// The runs' options from --train-args reach every run, and a CUDA graph's result line (system
// "dptrain+graph") is read like an eager one. One GPU is enough: the table then has 1-GPU rows only.
TEST(BenchScaling, CudaGraphRunsAreTabulated) {
  if (dpt::cuda::device_count() < 1) GTEST_SKIP() << "needs a GPU";
  std::filesystem::path out = std::filesystem::temp_directory_path() / "dpt_bench_scaling_graph_test";
  std::filesystem::remove_all(out);
  std::string cmd = std::string(DPT_BINARY_DIR) +
                    "/bin/dpt-bench scaling --workload mlp_small --device cuda --max-gpus 1 --steps 3 --warmup 1 " +
                    "--bucket-sweep 1 --train-args=--cuda-graph --out " + out.string() + " > " +
                    (out.string() + ".log") + " 2>&1";
  int status = std::system(cmd.c_str());
  ASSERT_EQ(status, 0) << read(out.string() + ".log");
  std::string csv = read(out / "scaling.csv");
  EXPECT_NE(csv.find("\n1,25,"), std::string::npos) << csv;
  EXPECT_NE(read(out.string() + ".log").find("(CUDA graph)"), std::string::npos) << read(out.string() + ".log");
  std::filesystem::remove_all(out);
}

// --train-args reaches the runs: an option `dpt-bench train` does not know fails the first run, naming it.
TEST(BenchScaling, TrainArgsReachEveryRun) {
  std::filesystem::path out = std::filesystem::temp_directory_path() / "dpt_bench_scaling_args_test";
  std::filesystem::remove_all(out);
  std::string cmd = std::string(DPT_BINARY_DIR) + "/bin/dpt-bench scaling --workload mlp_small --device cpu " +
                    "--max-gpus 1 --steps 1 --warmup 0 --bucket-sweep 1 --precision fp32 " +
                    "--train-args='--no-such-option 3' --out " + out.string() + " > " + (out.string() + ".log") +
                    " 2>&1";
  EXPECT_NE(std::system(cmd.c_str()), 0);
  EXPECT_NE(read(out.string() + ".log").find("--no-such-option"), std::string::npos) << read(out.string() + ".log");
  EXPECT_FALSE(std::filesystem::exists(out / "scaling.csv"));
  std::filesystem::remove_all(out);
}

TEST(BenchTrain, UnknownWorkloadIsAClearError) {
  std::string log = (std::filesystem::temp_directory_path() / "dpt_bench_train_bad.log").string();
  std::string cmd = std::string(DPT_BINARY_DIR) + "/bin/dpt-bench train --workload resnet > " + log + " 2>&1";
  int status = std::system(cmd.c_str());
  EXPECT_NE(status, 0);
  EXPECT_NE(read(log).find("unknown workload 'resnet'"), std::string::npos) << read(log);
}
