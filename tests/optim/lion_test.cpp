// Lion against a hand-computed recurrence, through a checkpoint, and on a tiny classifier.
#include "optim/lion.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>

#include "core/cuda_runtime.h"
#include "core/error.h"
#include "core/factory.h"
#include "core/ops.h"
#include "layers/activation.h"
#include "layers/linear.h"
#include "layers/losses.h"
#include "layers/sequential.h"
#include "optim/checkpoint.h"

namespace dpt::optim {
namespace {

const TensorOptions kF64 = TensorOptions{}.with_dtype(DType::Float64);

TEST(Lion, FollowsTheHandComputedRecurrence) {
  // f(w) = sum(a * w^2) / 2, so g = a * w; the scalar recurrence below is Lion written out per element.
  const std::vector<double> w0 = {1.0, -2.0, 0.05, 0.0}, av = {1.0, 0.5, 3.0, 2.0};
  Tensor w = from_vector(w0, {4}, kF64);
  w.requires_grad_(true);
  Tensor a = from_vector(av, {4}, kF64);
  LionOptions o;
  o.lr = 0.1;
  o.beta1 = 0.9;
  o.beta2 = 0.99;
  o.weight_decay = 0.5;
  Lion lion({{"w", w}}, o);
  std::vector<double> ref = w0, m(4, 0.0);
  for (int t = 0; t < 6; ++t) {
    lion.zero_grad();
    (sum(a * w * w) * 0.5).backward();
    lion.step();
    for (size_t i = 0; i < 4; ++i) {
      const double g = av[i] * ref[i];
      const double c = 0.9 * m[i] + 0.1 * g;
      const double s = c > 0 ? 1.0 : c < 0 ? -1.0 : 0.0;
      ref[i] = ref[i] * (1 - 0.1 * 0.5) - 0.1 * s;
      m[i] = 0.99 * m[i] + 0.01 * g;
    }
  }
  const std::vector<double> got = w.to_vector<double>();
  for (size_t i = 0; i < 4; ++i) EXPECT_NEAR(got[i], ref[i], 1e-12) << i;
  // The coordinate that starts at 0 has g = 0 forever: sign(0) = 0 keeps it there.
  EXPECT_EQ(got[3], 0.0);
  EXPECT_EQ(lion.step_count(), 6);
  EXPECT_EQ(lion.state_names(), std::vector<std::string>{"exp_avg"});
}

TEST(Lion, EveryCoordinateMovesByExactlyLrWithoutDecay) {
  Tensor w = zeros({3}, kF64);
  w.requires_grad_(true);
  Tensor c = from_vector<double>({1e-9, -50.0, 3.0}, {3}, kF64);
  LionOptions o;
  o.lr = 0.25;
  Lion lion({{"w", w}}, o);
  lion.zero_grad();
  sum(c * w).backward();
  lion.step();
  EXPECT_EQ(w.to_vector<double>(), (std::vector<double>{-0.25, 0.25, -0.25}));
}

TEST(Lion, RejectsBetasOutsideTheUnitInterval) {
  Tensor w = zeros({1}, kF64);
  w.requires_grad_(true);
  LionOptions o;
  o.beta2 = 1.5;
  EXPECT_THROW(Lion({{"w", w}}, o), Error);
}

struct TinyRun {
  Generator gen;
  std::shared_ptr<nn::Sequential> model;
  std::unique_ptr<Lion> opt;
  Tensor x, y;

  explicit TinyRun(uint64_t seed) : gen(seed) {
    model = std::make_shared<nn::Sequential>(std::vector<std::shared_ptr<nn::Module>>{
        std::make_shared<nn::Linear>(4, 16, true, gen), std::make_shared<nn::ReLU>(),
        std::make_shared<nn::Linear>(16, 3, true, gen)});
    LionOptions o;
    o.lr = 3e-3;
    opt = std::make_unique<Lion>(weight_decay_groups(model->named_parameters(), 0.1), o);
    Generator data(77);
    x = randn({32, 4}, data);
    // Labels a function of the inputs, so there is something to learn.
    y = argmax(slice(x, 1, 0, 3), 1);
  }

  double step() {
    opt->zero_grad();
    Tensor loss = nn::cross_entropy_loss(model->forward(x), y);
    loss.backward();
    opt->step();
    return loss.item();
  }
};

TEST(Lion, TrainsATinyClassifier) {
  TinyRun run(3);
  const double first = run.step();
  double last = first;
  for (int t = 0; t < 150; ++t) last = run.step();
  EXPECT_LT(last, 0.5 * first) << "first loss " << first;
}

TEST(Lion, StateRoundTripsThroughACheckpointAndResumesIdentically) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("dpt_lion_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string prefix = (dir / "ckpt").string();

  TinyRun straight(5), stopped(5);
  for (int t = 0; t < 5; ++t) {
    straight.step();
    stopped.step();
  }
  save_checkpoint(prefix, stopped.model->state_dict(), stopped.opt.get(), TrainingState{5, 0, 0, {}});

  TinyRun resumed(99);  // other initial weights: everything must come from the checkpoint
  Checkpoint ck = load_checkpoint(prefix);
  resumed.model->load_state_dict(ck.model);
  resumed.opt->load_state_dict(ck.optimizer);
  EXPECT_EQ(resumed.opt->step_count(), 5);
  ASSERT_TRUE(ck.optimizer.size() > 1);
  for (int t = 0; t < 5; ++t) EXPECT_EQ(resumed.step(), straight.step()) << "step " << t;
  fs::remove_all(dir);
}

TEST(Lion, CudaStepsMatchTheCpu) {
  if (!cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  Generator gen(8);
  Tensor w0 = randn({257, 3}, gen), target = randn({257, 3}, gen);
  std::vector<std::vector<float>> results;
  for (Device device : {Device::cpu(), Device::cuda(0)}) {
    Tensor w = w0.to(device).detach().clone();
    w.requires_grad_(true);
    Tensor t = target.to(device);
    LionOptions o;
    o.lr = 0.01;
    o.weight_decay = 0.1;
    Lion lion({{"w", w}}, o);
    for (int step = 0; step < 5; ++step) {
      lion.zero_grad();
      sum(mul(sub(w, t), sub(w, t))).backward();
      lion.step();
    }
    results.push_back(w.to(Device::cpu()).to_vector<float>());
  }
  // Elementwise ops in the same order on both devices: the same float32 numbers.
  EXPECT_EQ(results[1], results[0]);
}

}  // namespace
}  // namespace dpt::optim
