// Checkpoints: save, reload into fresh objects, continue = never stopping; damage is reported.
#include "optim/checkpoint.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include "core/error.h"
#include "core/factory.h"
#include "core/ops.h"
#include "layers/activation.h"
#include "layers/dropout.h"
#include "layers/linear.h"
#include "layers/losses.h"
#include "layers/sequential.h"
#include "optim/adam.h"

namespace dpt::optim {
namespace {

namespace fs = std::filesystem;

struct TrainingRun {
  Generator gen;
  std::shared_ptr<nn::Sequential> model;
  std::unique_ptr<AdamW> opt;
  Tensor x, y;

  explicit TrainingRun(uint64_t seed) : gen(seed) {
    model = std::make_shared<nn::Sequential>(std::vector<std::shared_ptr<nn::Module>>{
        std::make_shared<nn::Linear>(4, 16, true, gen), std::make_shared<nn::ReLU>(),
        std::make_shared<nn::Dropout>(0.2, gen), std::make_shared<nn::Linear>(16, 3, true, gen)});
    AdamOptions o;
    o.lr = 0.01;
    opt = std::make_unique<AdamW>(weight_decay_groups(model->named_parameters(), 0.1), o);
    Generator data(77);
    x = randn({32, 4}, data);
    y = randint({32}, 0, 3, data, TensorOptions{}.with_dtype(DType::Int64));
  }

  double step() {
    opt->zero_grad();
    Tensor loss = nn::cross_entropy_loss(model->forward(x), y);
    loss.backward();
    opt->step();
    return loss.item();
  }
};

class CheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("dpt_ckpt_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

TEST_F(CheckpointTest, ResumingGivesTheSameLossesAsNeverStopping) {
  TrainingRun straight(1);
  std::vector<double> expected;
  for (int i = 0; i < 10; ++i) expected.push_back(straight.step());

  TrainingRun first(1);
  std::vector<double> got;
  for (int i = 0; i < 4; ++i) got.push_back(first.step());
  TrainingState st;
  st.step = 4;
  st.rng_seed = first.gen.seed();
  st.rng_offset = first.gen.offset();
  st.extra["data.position"] = "128";
  std::string prefix = (dir_ / "step_4").string();
  save_checkpoint(prefix, first.model->state_dict(), first.opt.get(), st);

  TrainingRun resumed(999);  // different init, RNG and optimizer state: all must be overwritten
  Checkpoint ck = load_checkpoint(prefix);
  EXPECT_EQ(ck.state.step, 4);
  EXPECT_EQ(ck.state.extra.at("data.position"), "128");
  resumed.model->load_state_dict(ck.model);
  resumed.opt->load_state_dict(ck.optimizer);
  resumed.gen.set_state(ck.state.rng_seed, ck.state.rng_offset);
  for (int i = 0; i < 6; ++i) got.push_back(resumed.step());
  EXPECT_EQ(got, expected);
}

TEST_F(CheckpointTest, MismatchedFilesAndMissingStateAreReported) {
  TrainingRun run(1);
  run.step();
  std::string a = (dir_ / "a").string(), b = (dir_ / "b").string();
  save_checkpoint(a, run.model->state_dict(), run.opt.get(), TrainingState{1, 0, 0, {}});
  save_checkpoint(b, run.model->state_dict(), run.opt.get(), TrainingState{2, 0, 0, {}});
  // A crash between the two renames leaves files from different steps.
  fs::copy_file(b + ".model.safetensors", a + ".model.safetensors", fs::copy_options::overwrite_existing);
  try {
    load_checkpoint(a);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("model file is from step 2 but optimizer file from step 1"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(load_checkpoint((dir_ / "missing").string()), Error);
  EXPECT_THROW(save_checkpoint(a, {}, nullptr, TrainingState{1, 0, 0, {{"dpt.step", "x"}}}), Error);
}

}  // namespace
}  // namespace dpt::optim
