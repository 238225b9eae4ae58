// dpt-bench train's options for checking against PyTorch, on the CPU: --save-start writes the exact
// starting point (the reference trains from it), --losses prints every step's loss, --batches random
// trains each step on a fresh batch and saves every rank's batches, and --cuda-graph without a GPU is a
// clear error.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "core/ops.h"
#include "core/safetensors.h"
#include "layers/losses.h"
#include "layers/mlp.h"
#include "optim/adam.h"
#include "train_test_util.h"

namespace {

using dpt::train::test_util::read_text;

// The "losses" of the JSON line in a benchmark's output, run directly or under dpt-run (null, a non-finite loss, as
// NaN).
std::vector<double> losses_of(const std::string& output) {
  std::vector<double> out;
  std::istringstream lines(output);
  for (std::string line; std::getline(lines, line);) {
    const size_t brace = line.find('{');  // after dpt-run's "[rank]: " prefix
    if (brace == std::string::npos) continue;
    const nlohmann::json result = nlohmann::json::parse(line.substr(brace), nullptr, /*allow_exceptions=*/false);
    if (!result.is_object() || !result.contains("losses")) continue;
    for (const auto& loss : result["losses"]) out.push_back(loss.is_number() ? loss.get<double>() : std::nan(""));
  }
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
  ASSERT_TRUE(file.contains("__x.0.0") && file.contains("__y.0.0"));
  EXPECT_FALSE(file.contains("__x.0.1")) << "--batches repeat: one batch for every step";
  EXPECT_EQ(file.metadata.at("batches"), "1");
  EXPECT_EQ(file.metadata.at("ranks"), "1");
  EXPECT_EQ(file.at("__x.0.0").shape(), (dpt::Shape{32, 64}));
  EXPECT_EQ(file.at("__y.0.0").dtype(), dpt::DType::Int64);
  const double first = dpt::nn::cross_entropy_loss(model.forward(file.at("__x.0.0")), file.at("__y.0.0")).item();
  EXPECT_NEAR(first, losses[0], 1e-5 * std::abs(first));
  EXPECT_LT(losses.back(), losses.front()) << "training did not progress";
  std::filesystem::remove_all(dir);
}

// dpt-bench train's float32 step on mlp_small (AdamW, lr 3e-4, betas 0.9 and 0.95, weight decay 0.1 on
// the matrices), from the weights of a start file: what the saved batches must reproduce.
class SmallMlp {
 public:
  explicit SmallMlp(const dpt::SafetensorsContents& file) : gen_(123), model_({64, 128, 128, 10}, "relu", gen_) {
    dpt::NamedTensors params;
    for (const auto& [name, p] : model_.named_parameters()) params.emplace_back(name, file.at(name));
    model_.load_state_dict(params);
    dpt::optim::AdamOptions adam;
    adam.lr = 3e-4;
    adam.beta2 = 0.95;
    opt_ = std::make_unique<dpt::optim::AdamW>(dpt::optim::weight_decay_groups(model_.named_parameters(), 0.1), adam);
  }
  dpt::Tensor loss(const dpt::Tensor& x, const dpt::Tensor& y) {
    return dpt::nn::cross_entropy_loss(model_.forward(x), y);
  }
  // One step on the mean of the ranks' losses: the gradient DDP's averaging gives.
  void step(const std::vector<std::pair<dpt::Tensor, dpt::Tensor>>& rank_batches) {
    model_.zero_grad();
    dpt::Tensor total = loss(rank_batches[0].first, rank_batches[0].second);
    for (size_t r = 1; r < rank_batches.size(); ++r)
      total = total + loss(rank_batches[r].first, rank_batches[r].second);
    (total * (1.0 / static_cast<double>(rank_batches.size()))).backward();
    opt_->step();
  }

 private:
  dpt::Generator gen_;
  dpt::nn::MLP model_;
  std::unique_ptr<dpt::optim::AdamW> opt_;
};

bool same_values(const dpt::Tensor& a, const dpt::Tensor& b) { return a.to_vector<float>() == b.to_vector<float>(); }

std::pair<dpt::Tensor, dpt::Tensor> batch_of(const dpt::SafetensorsContents& file, int rank, int i) {
  std::ostringstream suffix;
  suffix << '.' << rank << '.' << i;
  return {file.at("__x" + suffix.str()), file.at("__y" + suffix.str())};
}

// --batches random: every step, warm-up included, trains on its own batch, and --save-start holds them
// all, so that training from the file's weights on the file's batches gives the printed losses. The
// first batch is --batches repeat's one batch.
TEST(BenchTrain, RandomBatchesAreSavedForEveryStepAndTrainedOnInTurn) {
  dpt::train::test_util::ScratchDir dir("bench_random_batches");
  auto train = [&](const std::string& batches, const std::string& start, const std::string& launcher = "") {
    const std::string log = dir.file(start + ".log");
    const std::string cmd = launcher + std::string(DPT_BINARY_DIR) + "/bin/dpt-bench train --workload mlp_small " +
                            "--device cpu --precision fp32 --steps 2 --warmup 1 --batches " + batches +
                            " --save-start " + dir.file(start) + " --losses > " + log + " 2>&1";
    EXPECT_EQ(std::system(cmd.c_str()), 0) << read_text(log);
    return losses_of(read_text(log));
  };
  const std::vector<double> repeat = train("repeat", "repeat.safetensors");
  const std::vector<double> random = train("random", "random.safetensors");
  ASSERT_EQ(repeat.size(), 3u);
  ASSERT_EQ(random.size(), 3u);
  const dpt::SafetensorsContents one = dpt::load_safetensors(dir.file("repeat.safetensors"));
  const dpt::SafetensorsContents file = dpt::load_safetensors(dir.file("random.safetensors"));
  EXPECT_EQ(file.metadata.at("batches"), "3");
  EXPECT_EQ(file.metadata.at("ranks"), "1");
  EXPECT_TRUE(same_values(file.at("__x.0.0"), one.at("__x.0.0")));
  EXPECT_FALSE(same_values(file.at("__x.0.1"), file.at("__x.0.0")));
  EXPECT_FALSE(same_values(file.at("__x.0.2"), file.at("__x.0.1")));

  SmallMlp model(file);
  for (int i = 0; i < 3; ++i) {
    const auto [x, y] = batch_of(file, 0, i);
    const double expected = model.loss(x, y).item();
    EXPECT_NEAR(random[i], expected, 1e-5 * expected) << "step " << i;
    if (i > 0) {  // the check tells the batches apart: the step's own batch, not the first one
      const auto [x0, y0] = batch_of(file, 0, 0);
      EXPECT_GT(std::abs(model.loss(x0, y0).item() - expected), 1e-4) << "step " << i;
    }
    model.step({{x, y}});
  }

  // Under dpt-run rank 0 saves rank 1's batches too: the gradient averaged over both ranks' batches
  // gives rank 0's next loss. Rank 0's batches are the single process's.
  const std::string dpt_run = std::string(DPT_BINARY_DIR) + "/bin/dpt-run --standalone --nproc-per-node 2 -- ";
  const std::vector<double> ddp = train("random", "ddp.safetensors", dpt_run);
  ASSERT_EQ(ddp.size(), 3u);
  const dpt::SafetensorsContents two = dpt::load_safetensors(dir.file("ddp.safetensors"));
  EXPECT_EQ(two.metadata.at("ranks"), "2");
  EXPECT_TRUE(same_values(two.at("__x.0.2"), file.at("__x.0.2")));
  EXPECT_FALSE(same_values(two.at("__x.1.0"), two.at("__x.0.0")));
  SmallMlp replica(two);
  for (int i = 0; i < 3; ++i) {
    const auto [x, y] = batch_of(two, 0, i);
    const double expected = replica.loss(x, y).item();
    EXPECT_NEAR(ddp[i], expected, 1e-5 * expected) << "step " << i;
    replica.step({batch_of(two, 0, i), batch_of(two, 1, i)});
  }
}

TEST(BenchTrain, CudaGraphWithRandomBatchesIsAClearError) {
  const std::string log = (std::filesystem::temp_directory_path() / "dpt_bench_train_graph_random.log").string();
  const std::string cmd = std::string(DPT_BINARY_DIR) + "/bin/dpt-bench train --workload mlp_small --device cpu " +
                          "--cuda-graph --batches random > " + log + " 2>&1";
  EXPECT_NE(std::system(cmd.c_str()), 0);
  EXPECT_NE(read_text(log).find("--cuda-graph replays the batch it captured: not with --batches random"),
            std::string::npos)
      << read_text(log);
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

namespace {

// A workload is its dpt-train config: another hidden width in the config is another model in the
// benchmark (parameter count 64*32 + 32 + 32*10 + 10 = 2410 for one hidden layer of 32, against the
// shipped mlp_small's 26122).
TEST(BenchTrain, AWorkloadIsTheModelAndBatchItsConfigDescribes) {
  const auto dir = std::filesystem::temp_directory_path() / "dpt_bench_train_config";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::string config = (dir / "narrow.yaml").string(), log = (dir / "out.log").string();
  std::string yaml = read_text(std::string(DPT_SOURCE_DIR) + "/configs/bench_mlp_small.yaml");
  const std::string hidden = "hidden: [128, 128]";
  ASSERT_NE(yaml.find(hidden), std::string::npos);
  yaml.replace(yaml.find(hidden), hidden.size(), "hidden: [32]");
  std::ofstream(config) << yaml;
  auto params_of = [&](const std::string& what) {
    const std::string cmd = std::string(DPT_BINARY_DIR) + "/bin/dpt-bench train " + what +
                            " --device cpu --precision fp32 --steps 1 --warmup 0 > " + log + " 2>&1";
    EXPECT_EQ(std::system(cmd.c_str()), 0) << read_text(log);
    const std::string out = read_text(log);
    const nlohmann::json r = nlohmann::json::parse(out.substr(out.find('{')), nullptr, false);
    return r.is_object() ? r["params"].get<int64_t>() : -1;
  };
  EXPECT_EQ(params_of("--workload mlp_small"), 26122);
  EXPECT_EQ(params_of("--config " + config), 2410);
  const std::string missing = std::string(DPT_BINARY_DIR) + "/bin/dpt-bench train --workload no_such --device cpu > " +
                              log + " 2>&1";
  EXPECT_NE(std::system(missing.c_str()), 0);
  EXPECT_NE(read_text(log).find("configs/bench_no_such.yaml"), std::string::npos) << read_text(log);
}

}  // namespace
