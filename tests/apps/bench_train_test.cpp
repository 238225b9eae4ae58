// dpt-bench train's options for checking against PyTorch, on the CPU: --save-start writes the exact
// starting point (the reference trains from it), --losses prints every step's loss, and --cuda-graph
// without a GPU is a clear error.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include "core/safetensors.h"
#include "layers/losses.h"
#include "layers/mlp.h"
#include "train_test_util.h"

namespace {

using dpt::train::test_util::read_text;

// The numbers of the JSON line's "losses": [a, b, ...].
std::vector<double> losses_of(const std::string& output) {
  std::vector<double> out;
  const size_t key = output.find("\"losses\": [");
  if (key == std::string::npos) return out;
  std::istringstream list(output.substr(key + 11, output.find(']', key) - key - 11));
  std::string item;
  while (std::getline(list, item, ',')) out.push_back(std::stod(item));
  return out;
}

TEST(BenchTrain, SaveStartHoldsTheStartingPointOfTheFirstLoss) {
  const auto dir = std::filesystem::temp_directory_path() / "dpt_bench_train_start";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::string start = (dir / "start.safetensors").string(), log = (dir / "out.log").string();
  const std::string cmd = std::string(DPT_BINARY_DIR) + "/bin/dpt-bench train --workload mlp_small --device cpu " +
                          "--precision fp32 --steps 3 --warmup 1 --save-start " + start + " --losses > " + log +
                          " 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << read_text(log);
  const std::vector<double> losses = losses_of(read_text(log));
  ASSERT_EQ(losses.size(), 4u) << "one loss per step, warm-up included: " << read_text(log);

  // The file's weights and batch give the first step's loss exactly: it is where training started.
  const dpt::SafetensorsContents file = dpt::load_safetensors(start);
  dpt::Generator gen(123);  // any weights: all of them are replaced from the file
  dpt::nn::MLP model({64, 128, 128, 10}, "relu", gen);
  dpt::NamedTensors params;
  for (const auto& [name, p] : model.named_parameters()) params.emplace_back(name, file.at(name));
  model.load_state_dict(params);
  ASSERT_TRUE(file.contains("__x") && file.contains("__y"));
  EXPECT_EQ(file.at("__x").shape(), (dpt::Shape{32, 64}));
  EXPECT_EQ(file.at("__y").dtype(), dpt::DType::Int64);
  const double first = dpt::nn::cross_entropy_loss(model.forward(file.at("__x")), file.at("__y")).item();
  EXPECT_NEAR(first, losses[0], 1e-5 * std::abs(first));
  EXPECT_LT(losses.back(), losses.front()) << "training did not progress";
  std::filesystem::remove_all(dir);
}

TEST(BenchTrain, CudaGraphWithoutAGpuIsAClearError) {
  const std::string log = (std::filesystem::temp_directory_path() / "dpt_bench_train_graph.log").string();
  const std::string cmd = std::string(DPT_BINARY_DIR) +
                          "/bin/dpt-bench train --workload mlp_small --device cpu --cuda-graph > " + log + " 2>&1";
  EXPECT_NE(std::system(cmd.c_str()), 0);
  EXPECT_NE(read_text(log).find("--cuda-graph runs on a GPU (device cpu)"), std::string::npos) << read_text(log);
}

// The capture must follow an eager step (library handles and buffers are created on first use, which a
// capture cannot do): --warmup 0 is refused before anything runs, on any device.
TEST(BenchTrain, CudaGraphWithoutAWarmUpStepIsAClearError) {
  const std::string log = (std::filesystem::temp_directory_path() / "dpt_bench_train_graph_warmup.log").string();
  const std::string cmd = std::string(DPT_BINARY_DIR) +
                          "/bin/dpt-bench train --workload mlp_small --device cpu --cuda-graph --warmup 0 > " + log +
                          " 2>&1";
  EXPECT_NE(std::system(cmd.c_str()), 0);
  EXPECT_NE(read_text(log).find("--cuda-graph needs --warmup 1 or more"), std::string::npos) << read_text(log);
}

}  // namespace
