// A model that cannot fit is refused before anything is allocated, with the estimate, what is available
// and the keys that size it (it used to die in std::bad_alloc, or grow until the OOM killer came). The
// estimate's parameter count is exact for the model families it counts.
#include "memory_estimate.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "config.h"
#include "core/device.h"
#include "core/factory.h"
#include "core/flags.h"
#include "layers/conv.h"
#include "layers/feed_forward.h"
#include "layers/gpt.h"
#include "layers/linear.h"
#include "layers/mlp.h"
#include "processes.h"

namespace {

namespace fs = std::filesystem;
using dpt::reliability::Child;
using dpt::reliability::Finished;
using dpt::reliability::kBin;
using dpt::reliability::ScratchDir;
using dpt::train::estimate_training_memory;

constexpr double kLimit = 120;  // seconds: only catches hangs

// dpt-train on a GPT of the given size; `shell_prefix` (e.g. "ulimit -v N") runs before it in sh.
Finished train_gpt(const ScratchDir& dir, int64_t n_embd, int64_t n_layer, const std::string& shell_prefix = "",
                   const std::vector<std::string>& env = {}) {
  std::vector<std::string> argv = {"/bin/sh",          "-c",       shell_prefix + " exec \"$0\" \"$@\"",
                                   kBin + "dpt-train", "--config", DPT_SOURCE_DIR "/configs/char_gpt.yaml"};
  for (const std::string& o : {std::string("training.device=cpu"), "model.gpt.n_embd=" + std::to_string(n_embd),
                               "model.gpt.n_layer=" + std::to_string(n_layer), "checkpoint.dir=" + dir.file("run")}) {
    argv.insert(argv.end(), {"--set", o});
  }
  return Child(argv, dir.file("log"), env).wait(kLimit);
}

TEST(MemoryEstimate, AGptOfWidth65536And1024LayersIsRefusedNamingItsKeys) {
  ScratchDir dir;
  Finished f = train_gpt(dir, 65536, 1024);
  ASSERT_FALSE(f.hung) << f.output;
  EXPECT_EQ(f.exit_code, 1) << f.output;
  EXPECT_CONTAINS(f.output, "the model does not fit: training it needs about 772.5 TiB (5.278e+13 parameters");
  EXPECT_CONTAINS(f.output, "but this host has ");
  EXPECT_CONTAINS(f.output, "model.gpt.n_layer 1024, model.gpt.n_embd 65536");
  EXPECT_CONTAINS(f.output, "training.batch_size 16, data.seq_len 64");
  EXPECT_EQ(f.output.find("bad_alloc"), std::string::npos) << f.output;
  EXPECT_FALSE(fs::exists(dir.file("run"))) << f.output;
}

// 206G parameters: every allocation would succeed at first (the kernel overcommits) and the process grow
// until the OOM killer ends it. Refused before the first.
TEST(MemoryEstimate, AGptOfWidth16384And64LayersIsRefusedBeforeAllocating) {
  ScratchDir dir;
  Finished f = train_gpt(dir, 16384, 64);
  ASSERT_FALSE(f.hung) << f.output;
  EXPECT_EQ(f.exit_code, 1) << f.output;
  EXPECT_CONTAINS(f.output,
                  "(2.062e+11 parameters: weights 768.1 GiB (float32), gradients 768.1 GiB, optimizer "
                  "state 1.5 TiB (adamw), activations");
  EXPECT_CONTAINS(f.output, "model.gpt.n_layer 64, model.gpt.n_embd 16384");
}

#if defined(__SANITIZE_ADDRESS__)
#define DPT_TEST_UNDER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define DPT_TEST_UNDER_ASAN 1
#endif
#endif

// With the check off, the trainer goes on to allocate the model; a 4 GB address-space limit makes that
// fail at once, whatever the kernel's overcommit policy.
TEST(MemoryEstimate, TheCheckCanBeTurnedOff) {
#ifdef DPT_TEST_UNDER_ASAN
  GTEST_SKIP() << "AddressSanitizer cannot start under an address-space limit";
#endif
  ScratchDir dir;
  Finished f = train_gpt(dir, 65536, 1024, "ulimit -v 4000000 &&", {"DPT_MEMORY_CHECK=0"});
  ASSERT_FALSE(f.hung) << f.output;
  EXPECT_EQ(f.exit_code, 1) << f.output;
  EXPECT_EQ(f.output.find("the model does not fit"), std::string::npos) << f.output;
  EXPECT_CONTAINS(f.output, "bad_alloc");
}

int64_t parameters_of(const dpt::nn::Module& m) { return m.num_parameters(); }

TEST(MemoryEstimate, CountsTheParametersOfTheModelsExactly) {
  dpt::Generator gen(0);
  dpt::train::Config config;
  dpt::train::DataShape shape;
  // GPT: the vocabulary and context from the data.
  config.model.kind = "gpt";
  config.model.gpt.n_layer = 3;
  config.model.gpt.n_head = 4;
  config.model.gpt.n_embd = 32;
  shape.tokens = true;
  shape.vocab_size = 97;
  shape.seq_len = 16;
  dpt::nn::GPTConfig gc;
  gc.vocab_size = 97;
  gc.block_size = 16;
  gc.n_layer = 3;
  gc.n_head = 4;
  gc.n_embd = 32;
  EXPECT_EQ(estimate_training_memory(config, shape, dpt::DType::Float32, dpt::Device::cpu(), 1).parameters,
            parameters_of(dpt::nn::GPT(gc, gen)));
  // Every registered feed-forward, with and without biases: the count comes from its registry entry.
  for (const std::string& ffn : dpt::nn::feed_forwards().names()) {
    for (bool bias : {true, false}) {
      config.model.gpt.ffn = gc.ffn = ffn;
      config.model.gpt.bias = gc.bias = bias;
      EXPECT_EQ(estimate_training_memory(config, shape, dpt::DType::Float32, dpt::Device::cpu(), 1).parameters,
                parameters_of(dpt::nn::GPT(gc, gen)))
          << ffn << (bias ? " with" : " without") << " biases";
    }
  }
  // MLP.
  config.model.kind = "mlp";
  config.model.mlp.hidden = {48, 24};
  shape = {};
  shape.num_features = 10;
  shape.num_outputs = 3;
  EXPECT_EQ(estimate_training_memory(config, shape, dpt::DType::Float32, dpt::Device::cpu(), 1).parameters,
            parameters_of(dpt::nn::MLP({10, 48, 24, 3}, "relu", gen)));
  // CNN (apps/train/models/cnn.cpp): conv(3 -> 8), conv(8 -> 16), both 5x5, pools to 4x4, then 32, 10.
  config.model.kind = "cnn";
  config.model.cnn.channels = {8, 16};
  config.model.cnn.kernel_size = 5;
  config.model.cnn.hidden = 32;
  shape = {};
  shape.images = true;
  shape.channels = 3;
  shape.height = shape.width = 16;
  shape.num_outputs = 10;
  const int64_t cnn = parameters_of(dpt::nn::Conv2d(3, 8, 5, 1, 2, true, gen)) +
                      parameters_of(dpt::nn::Conv2d(8, 16, 5, 1, 2, true, gen)) +
                      parameters_of(dpt::nn::Linear(16 * 4 * 4, 32, true, gen)) +
                      parameters_of(dpt::nn::Linear(32, 10, true, gen));
  EXPECT_EQ(estimate_training_memory(config, shape, dpt::DType::Float32, dpt::Device::cpu(), 1).parameters, cnn);
}

TEST(MemoryEstimate, MixedPrecisionAndTheOptimizerAddWhatTheyKeep) {
  dpt::train::Config config;
  config.model.kind = "mlp";
  config.model.mlp.hidden = {100};
  dpt::train::DataShape shape;
  shape.num_features = 10;
  shape.num_outputs = 2;
  const double p = 10 * 100 + 100 + 100 * 2 + 2;
  config.optim.kind = "adamw";
  auto fp32 = estimate_training_memory(config, shape, dpt::DType::Float32, dpt::Device::cpu(), 1);
  EXPECT_EQ(fp32.weights, 4 * p);
  EXPECT_EQ(fp32.masters, 0);
  EXPECT_EQ(fp32.gradients, 4 * p);
  EXPECT_EQ(fp32.optimizer, 8 * p);
  EXPECT_EQ(fp32.buckets, 0);
  auto bf16 = estimate_training_memory(config, shape, dpt::DType::BFloat16, dpt::Device::cpu(), 2);
  EXPECT_EQ(bf16.weights, 2 * p);
  EXPECT_EQ(bf16.masters, 4 * p);
  EXPECT_EQ(bf16.gradients, 6 * p);
  EXPECT_EQ(bf16.buckets, 2 * p);
  config.optim.kind = "sgd";
  config.optim.momentum = 0;
  EXPECT_EQ(estimate_training_memory(config, shape, dpt::DType::Float32, dpt::Device::cpu(), 1).optimizer, 0);
  config.optim.momentum = 0.9;
  EXPECT_EQ(estimate_training_memory(config, shape, dpt::DType::Float32, dpt::Device::cpu(), 1).optimizer, 4 * p);
  // Activations grow with the batch.
  config.training.batch_size = 10;
  const double small = estimate_training_memory(config, shape, dpt::DType::Float32, dpt::Device::cpu(), 1).activations;
  config.training.batch_size = 20;
  EXPECT_DOUBLE_EQ(estimate_training_memory(config, shape, dpt::DType::Float32, dpt::Device::cpu(), 1).activations,
                   2 * small);
}

// A GPT's [T x T] attention scores are left out only where the GPU runs attention fused: bfloat16 with
// a head size the kernels take, and DPT_ATTENTION not reference. float32 and other head sizes compose the
// op on the GPU and keep 3 H T values per token and layer, as on the CPU.
TEST(MemoryEstimate, OnAGpuOnlyFusedAttentionLeavesTheScoresOut) {
  dpt::train::Config config;
  config.model.kind = "gpt";
  config.model.gpt.n_layer = 2;
  config.model.gpt.n_head = 4;
  config.model.gpt.n_embd = 256;  // D = 64
  config.training.batch_size = 3;
  dpt::train::DataShape shape;
  shape.tokens = true;
  shape.vocab_size = 97;
  shape.seq_len = 32;
  auto activations = [&](dpt::DType dtype, const dpt::Device& device) {
    return estimate_training_memory(config, shape, dtype, device, 1).activations;
  };
  const dpt::Device gpu = dpt::Device::cuda(0), cpu = dpt::Device::cpu();
  // b t (layers + 1) 3 H T values of 2 bytes.
  const double scores = 3.0 * 32 * (2 + 1) * 3 * 4 * 32 * 2;
  EXPECT_DOUBLE_EQ(activations(dpt::DType::BFloat16, cpu) - activations(dpt::DType::BFloat16, gpu), scores);
  EXPECT_DOUBLE_EQ(activations(dpt::DType::Float32, gpu), activations(dpt::DType::Float32, cpu));
  {
    dpt::ScopedFlag reference(dpt::Flag::Attention, "reference");
    EXPECT_DOUBLE_EQ(activations(dpt::DType::BFloat16, gpu), activations(dpt::DType::BFloat16, cpu));
  }
  config.model.gpt.n_embd = 192;  // D = 48: no kernels
  EXPECT_DOUBLE_EQ(activations(dpt::DType::BFloat16, gpu), activations(dpt::DType::BFloat16, cpu));
}

TEST(MemoryEstimate, TheHostsAvailableMemoryIsReadAndSharedByItsProcesses) {
  std::string one, two;
  const double a = dpt::train::available_memory(dpt::Device::cpu(), 1, &one);
  const double b = dpt::train::available_memory(dpt::Device::cpu(), 2, &two);
  EXPECT_GT(a, 0) << one;
  EXPECT_NEAR(b, a / 2, a / 10) << two;  // the host's free memory moves a little between the two reads
  EXPECT_CONTAINS(one, "this host has ");
  EXPECT_CONTAINS(two, "for 2 processes");
}

}  // namespace
