// Every program's command line (apps/command_line.h), run as users run them: --help exits 0 with a
// description and examples, also for each dpt-bench subcommand; an integer option refuses "1e3" and
// "12x", a float option refuses "abc", an unknown option is refused, each with exit code 2 and a
// message naming the option and the value. dpt-train keeps its overrides in order; dpt-run takes
// torchrun's spellings and its program with or without '--'.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "train_test_util.h"

namespace dpt::train {
namespace {

using namespace test_util;

constexpr int kUsageError = 2;

RunResult run_program(const std::string& command_line) { return run_shell(bin("") + command_line); }

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

struct HelpCase {
  std::string command;  // program [subcommand]
  std::string example;  // a line of its examples
  std::string option;   // one of its own options
};

TEST(CommandLine, HelpExitsZeroAndShowsTheProgramsExamplesAndOptions) {
  const std::vector<HelpCase> cases = {
      {"dpt-train", "dpt-train --config configs/mlp_synthetic.yaml", "--config-reference"},
      {"dpt-run", "dpt-run --standalone --nproc-per-node 2 -- dpt-train", "--nproc-per-node,--nproc_per_node"},
      {"dpt-bench", "dpt-bench scaling --help", "scaling"},
      {"dpt-bench scaling", "dpt-bench scaling --workload gpt2_124m --max-gpus 8", "--bucket-sweep"},
      {"dpt-bench train", "dpt-bench train --workload gpt2_124m --precision bf16", "--save-start"},
      {"dpt-bench collectives", "dpt-bench collectives --backend nccl", "--step-factor"},
      {"dpt-bench kernels", "dpt-bench kernels --only layer_norm", "--peak-gbs"},
      {"dpt-bench attention", "dpt-bench attention --path flash", "--path"},
      {"dpt-example-mlp", "dpt-example-mlp --steps 200", "--lr"},
      {"dpt-tokenize", "dpt-tokenize --input tinyshakespeare.txt", "--val-fraction"},
      {"dpt-generate", "dpt-generate runs/char_gpt --prompt", "--top-k"},
      {"dpt-export-hf", "dpt-export-hf runs/gpt2 hf/gpt2", "--vocab-size"},
      {"dpt-example-ddp", "dpt-example-ddp --device cpu", "--steps"},
  };
  for (const auto& c : cases) {
    const RunResult r = run_program(c.command + " --help");
    EXPECT_EQ(r.exit_code, 0) << c.command << ":\n" << r.output;
    EXPECT_TRUE(contains(r.output, "Examples:\n  ")) << c.command << ":\n" << r.output;
    EXPECT_TRUE(contains(r.output, c.example)) << c.command << ":\n" << r.output;
    EXPECT_TRUE(contains(r.output, c.option)) << c.command << ":\n" << r.output;
    EXPECT_FALSE(contains(r.output, "unknown")) << c.command << ":\n" << r.output;
  }
}

// `command` is refused as a usage error whose message names `option` and `value`.
void expect_usage_error(const std::string& command, const std::string& option, const std::string& value) {
  const RunResult r = run_program(command);
  EXPECT_EQ(r.exit_code, kUsageError) << command << ":\n" << r.output;
  EXPECT_TRUE(contains(r.output, option)) << command << ":\n" << r.output;
  EXPECT_TRUE(contains(r.output, value)) << command << ":\n" << r.output;
  EXPECT_FALSE(contains(r.output, "stoi")) << command << ":\n" << r.output;
}

TEST(CommandLine, AnIntegerOptionRefusesScientificNotationAndTrailingText) {
  expect_usage_error("dpt-bench train --workload mlp_small --device cpu --steps 1e3", "--steps", "1e3");
  expect_usage_error("dpt-bench train --steps 12x", "--steps", "12x");
  expect_usage_error("dpt-bench scaling --steps 1e3", "--steps", "1e3");
  expect_usage_error("dpt-bench scaling --max-gpus 2.5", "--max-gpus", "2.5");
  expect_usage_error("dpt-bench collectives --iters 1e3", "--iters", "1e3");
  expect_usage_error("dpt-bench kernels --batch 16x", "--batch", "16x");
  expect_usage_error("dpt-bench attention --seq 1e3", "--seq", "1e3");
  expect_usage_error("dpt-example-mlp --steps 1e3", "--steps", "1e3");
  expect_usage_error("dpt-run --max-restarts 1e3 -- true", "--max-restarts", "1e3");
  expect_usage_error("dpt-run --nproc-per-node 2x -- true", "--nproc-per-node", "2x");
  expect_usage_error("dpt-generate run --max-tokens 1e3", "--max-tokens", "1e3");
}

TEST(CommandLine, AFloatOptionRefusesWhatIsNotANumber) {
  expect_usage_error("dpt-example-mlp --lr abc", "--lr", "abc");
  expect_usage_error("dpt-example-mlp --lr nan", "--lr", "nan");
  expect_usage_error("dpt-bench train --bucket-cap-mb abc", "--bucket-cap-mb", "abc");
  expect_usage_error("dpt-bench scaling --bucket-sweep 1,x,25", "--bucket-sweep", "x");
  expect_usage_error("dpt-run --grace-period abc -- true", "--grace-period", "abc");
  expect_usage_error("dpt-generate run --temperature abc", "--temperature", "abc");
  expect_usage_error("dpt-tokenize -i in.txt -o out.bin --val-fraction abc", "--val-fraction", "abc");
}

TEST(CommandLine, AnUnknownOptionIsRefused) {
  for (const std::string program :
       {"dpt-train -c configs/mlp_synthetic.yaml", "dpt-bench train", "dpt-bench scaling", "dpt-bench collectives",
        "dpt-bench kernels", "dpt-bench attention", "dpt-example-mlp", "dpt-tokenize -i a -o b", "dpt-generate run",
        "dpt-export-hf run out"}) {
    expect_usage_error(program + " --no-such-option 1", "--no-such-option", "");
  }
  expect_usage_error("dpt-run --no-such-option 1 -- true", "--no-such-option", "");
  expect_usage_error("dpt-bench no-such-benchmark", "subcommand", "");
  expect_usage_error("dpt-bench", "subcommand", "");
}

TEST(CommandLine, DptTrainAppliesSetAndBareOverridesInTheOrderGiven) {
  const std::string config = " -c " + quote(config_path("mlp_synthetic.yaml")) + " --print-config";
  RunResult r = run_program("dpt-train" + config + " training.steps=7 --set training.steps=9 training.steps=50");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "  steps: 50\n")) << r.output;
  r = run_program("dpt-train" + config + " training.steps=50 --set training.steps=60");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "  steps: 60\n")) << r.output;
  // A bare argument without '=' is a mistake, not an override.
  expect_usage_error("dpt-train" + config + " training.steps", "training.steps", "is not an option or an override");
  expect_usage_error("dpt-train --print-config", "--config", "required");
}

TEST(CommandLine, DptRunTakesTorchrunsSpellingsAndItsProgramWithOrWithoutDashes) {
  RunResult r =
      run_program("dpt-run --standalone --nproc_per_node=2 --max_restarts 0 sh -c 'echo R=$RANK W=$WORLD_SIZE'");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "[0]: R=0 W=2\n")) << r.output;
  EXPECT_TRUE(contains(r.output, "[1]: R=1 W=2\n")) << r.output;
  // After '--' the program's own options are its own, --help included.
  r = run_program(
      "dpt-run --nproc-per-node 1 --nnodes 2 --node_rank 1 --master_addr 10.9.8.7 --master_port 1234 -- "
      "sh -c 'echo A=$MASTER_ADDR P=$MASTER_PORT \"$@\"' sh --help");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "[1]: A=10.9.8.7 P=1234 --help\n")) << r.output;
  expect_usage_error("dpt-run --nproc-per-node 2", "program", "'--'");
}

}  // namespace
}  // namespace dpt::train
