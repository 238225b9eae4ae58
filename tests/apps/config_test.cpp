#include "config.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "core/cuda_runtime.h"
#include "data/token_file.h"

namespace dpt::train {
namespace {

namespace fs = std::filesystem;

const LoadOptions kNoDevice{.check_files = true, .check_device = false};

// The problems of a config that must fail to load.
std::vector<std::string> problems_of(const std::string& yaml, const std::vector<std::string>& overrides = {},
                                     const LoadOptions& options = kNoDevice) {
  try {
    load_config_text(yaml, "test.yaml", overrides, options);
  } catch (const ConfigError& e) {
    return e.problems();
  }
  ADD_FAILURE() << "config loaded but should have failed:\n" << yaml;
  return {};
}

// The single problem of a config, checked to contain every part.
void expect_problem(const std::string& yaml, const std::vector<std::string>& parts,
                    const std::vector<std::string>& overrides = {}) {
  auto problems = problems_of(yaml, overrides);
  ASSERT_EQ(problems.size(), 1u) << (problems.empty() ? "" : problems[0]);
  for (const auto& part : parts)
    EXPECT_NE(problems[0].find(part), std::string::npos) << problems[0] << "\nmissing: " << part;
}

class ScratchDir {
 public:
  ScratchDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    path_ = fs::path(DPT_BINARY_DIR) / "test_tmp" /
            (std::string("config.") + info->name() + "." + std::to_string(::getpid()));
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~ScratchDir() { fs::remove_all(path_); }
  std::string file(const std::string& name) const { return (path_ / name).string(); }
  std::string write(const std::string& name, const std::string& text) const {
    fs::create_directories((path_ / name).parent_path());
    std::ofstream(file(name)) << text;
    return file(name);
  }

 private:
  fs::path path_;
};

TEST(EditDistance, CountsInsertionsDeletionsAndSubstitutions) {
  EXPECT_EQ(edit_distance("", "abc"), 3u);
  EXPECT_EQ(edit_distance("n_layr", "n_layer"), 1u);
  EXPECT_EQ(edit_distance("kitten", "sitting"), 3u);
  EXPECT_EQ(edit_distance("same", "same"), 0u);
}

TEST(Config, AnEmptyFileMeansEveryDefault) {
  Config c = load_config_text("", "<string>", {}, kNoDevice);
  EXPECT_EQ(c.model.kind, "mlp");
  EXPECT_EQ(c.model.mlp.hidden, (std::vector<int64_t>{64, 64}));
  EXPECT_EQ(c.data.kind, "synthetic_classification");
  EXPECT_EQ(c.training.steps, 200);
  EXPECT_EQ(c.training.batch_size, 32);
  EXPECT_EQ(c.optim.kind, "adamw");
  EXPECT_DOUBLE_EQ(c.distributed.bucket_cap_mb, 25.0);
  EXPECT_EQ(c.checkpoint.resume, "auto");
  EXPECT_EQ(c.checkpoint.dir, "runs/default");
  EXPECT_EQ(c.logging.metrics_file, "runs/default/metrics.jsonl");
}

TEST(Config, FileValuesThenOverridesInOrder) {
  const std::string yaml = R"(
model:
  kind: gpt
  gpt: {n_layer: 2, n_head: 2, n_embd: 32}
data:
  kind: synthetic_tokens
  vocab_size: 100
  num_tokens: 5000
  seq_len: 16
training:
  batch_size: 8
  steps: 10
optim:
  lr: 1e-3
)";
  Config c = load_config_text(yaml, "configs/my_run.yaml",
                              {"training.steps=25", "optim.lr=0.5", "model.gpt.n_layer=3", "checkpoint.dir=runs/a=b",
                               "+training.grad_accum=4", "++training.batch_size=6", "training.steps=30"},
                              kNoDevice);
  EXPECT_EQ(c.model.kind, "gpt");
  EXPECT_EQ(c.model.gpt.n_layer, 3);
  EXPECT_EQ(c.model.gpt.n_embd, 32);
  EXPECT_EQ(c.training.steps, 30);  // the last override wins
  EXPECT_EQ(c.training.batch_size, 6);
  EXPECT_EQ(c.training.grad_accum, 4);
  EXPECT_DOUBLE_EQ(c.optim.lr, 0.5);
  EXPECT_EQ(c.checkpoint.dir, "runs/a=b");  // values may contain '='
  EXPECT_EQ(c.logging.metrics_file, "runs/a=b/metrics.jsonl");
  EXPECT_EQ(c.data.path, "runs/a=b/data/synthetic_tokens_v100_n5000_s0.bin");  // generated on first use
  EXPECT_EQ(c.source_file, "configs/my_run.yaml");
  EXPECT_EQ(c.overrides.size(), 7u);
}

TEST(Config, ListOverridesReplaceTheListOrOneItem) {
  Config whole = load_config_text("", "t.yaml", {"model.mlp.hidden=[128, 32, 8]"}, kNoDevice);
  EXPECT_EQ(whole.model.mlp.hidden, (std::vector<int64_t>{128, 32, 8}));
  Config item = load_config_text("model:\n  mlp:\n    hidden: [10, 20]\n", "t.yaml",
                                 {"model.mlp.hidden.1=99", "model.mlp.hidden.2=7"}, kNoDevice);
  EXPECT_EQ(item.model.mlp.hidden, (std::vector<int64_t>{10, 99, 7}));
  expect_problem("", {"override #1", "model.mlp.hidden.5", "past the end", "2 items"}, {"model.mlp.hidden.5=1"});
}

TEST(Config, EpochsInsteadOfSteps) {
  Config c = load_config_text("training:\n  epochs: 3\n", "t.yaml", {}, kNoDevice);
  EXPECT_EQ(c.training.epochs, 3);
  EXPECT_EQ(c.training.steps, 0);
  expect_problem("training:\n  epochs: 3\n  steps: 10\n", {"training.epochs", "either training.steps", "not both"});
  expect_problem("training:\n  steps: 0\n", {"test.yaml:2:3", "training.steps", "must be > 0"});
}

TEST(ConfigErrors, UnknownKeyNamesPathLineAndSuggestion) {
  expect_problem("model:\n  gpt:\n    n_layr: 3\n",
                 {"test.yaml:3:5: model.gpt.n_layr: unknown key; did you mean 'model.gpt.n_layer'?",
                  "Keys of 'model.gpt': vocab_size, block_size, n_layer"});
  expect_problem("trainig:\n  steps: 5\n", {"test.yaml:1:1: trainig: unknown key; did you mean 'training'?"});
  // A key of another section is found by name.
  expect_problem("training:\n  lr: 0.1\n", {"test.yaml:2:3: training.lr", "did you mean 'optim.lr'?"});
  // Nothing close: no suggestion, but the allowed keys.
  auto p = problems_of("optim:\n  zzzzzzzz: 1\n");
  ASSERT_EQ(p.size(), 1u);
  EXPECT_EQ(p[0].find("did you mean"), std::string::npos) << p[0];
  EXPECT_NE(p[0].find("Keys of 'optim': kind, lr, weight_decay"), std::string::npos) << p[0];
}

TEST(ConfigErrors, WrongTypesSayWhatIsAllowed) {
  expect_problem("training:\n  batch_size: abc\n",
                 {"test.yaml:2:3: training.batch_size: expected an integer >= 1, got 'abc'"});
  expect_problem("optim:\n  lr: fast\n", {"optim.lr", "expected a number in (0, 100] (finite), got 'fast'"});
  expect_problem("data:\n  shuffle: maybe\n", {"data.shuffle", "expected true or false, got 'maybe'"});
  expect_problem("model:\n  mlp:\n    hidden: 64\n",
                 {"model.mlp.hidden", "expected a list of integers >= 1, got '64'"});
  expect_problem("model:\n  mlp:\n    hidden: [64, x]\n", {"model.mlp.hidden", "item 1: expected an integer, got 'x'"});
  expect_problem("training:\n  steps: {a: 1}\n", {"training.steps", "got a mapping"});
  expect_problem("training:\n  steps: 2.5\n", {"training.steps", "got '2.5'"});
  expect_problem("model: 3\n", {"test.yaml:1:1: model: is a section", "kind, mlp, gpt, cnn"});
  expect_problem("[1, 2]\n", {"test.yaml: expected a mapping of sections", "model, data, training"});
}

TEST(ConfigErrors, OutOfRangeValuesAndChoices) {
  expect_problem("training:\n  batch_size: 0\n", {"training.batch_size", "expected an integer >= 1, got 0"});
  expect_problem("optim:\n  lr: -0.1\n", {"optim.lr", "in (0, 100], got -0.1"});
  expect_problem("model:\n  gpt:\n    dropout: 1.5\n", {"model.gpt.dropout", "in [0, 1), got 1.5"});
  // Open at the top where the layer or the optimizer would reject the bound itself.
  expect_problem("model:\n  gpt:\n    dropout: 1\n", {"model.gpt.dropout", "in [0, 1), got 1"});
  expect_problem("optim:\n  beta2: 1.0\n", {"optim.beta2", "in [0, 1), got 1"});
  EXPECT_DOUBLE_EQ(load_config_text("optim:\n  beta2: 0.9999999999\n", "t.yaml", {}, kNoDevice).optim.beta2,
                   0.9999999999);
  expect_problem("optim:\n  kind: adamm\n",
                 {"optim.kind", "one of adamw | adam | sgd | lion, got 'adamm'", "did you mean"});
  expect_problem("training:\n  precision: fp8\n", {"training.precision", "fp32 | bf16 | fp16", "'fp8'"});
  expect_problem("training:\n  device: tpu\n", {"training.device", "auto | cpu | cuda | cuda:N", "'tpu'"});
  expect_problem("training:\n  device: cuda:x\n", {"training.device", "cuda:N"});
}

TEST(ConfigErrors, InconsistentCombinations) {
  expect_problem("model:\n  kind: gpt\n", {"data.kind", "gpt needs token data", "synthetic_classification"});
  expect_problem("model:\n  kind: cnn\n", {"data.kind", "cnn needs image data"});
  expect_problem("data:\n  kind: synthetic_tokens\n", {"data.kind", "mlp needs feature data"});
  expect_problem("model:\n  kind: gpt\n  gpt: {n_embd: 30, n_head: 4}\ndata:\n  kind: synthetic_tokens\n",
                 {"test.yaml:3:9: model.gpt.n_embd", "divisible by model.gpt.n_head (4), got 30"});
  expect_problem("data:\n  num_features: 3\n", {"data.num_features", "spirals", "needs 2, got 3"});
  expect_problem("data:\n  num_samples: 10\ntraining:\n  batch_size: 64\n",
                 {"training.batch_size", "64 is larger than the dataset (data.num_samples 10)"});
  expect_problem("schedule:\n  kind: cosine\n  warmup_steps: 500\n",
                 {"schedule.warmup_steps", "below training.steps (200)"});
  expect_problem("training:\n  device: cpu\ndistributed:\n  backend: nccl\n",
                 {"distributed.backend", "nccl needs GPUs"});
}

TEST(ConfigErrors, MissingFilesAreNamed) {
  expect_problem("model:\n  kind: gpt\ndata:\n  kind: text\n  path: no/such/file.txt\n",
                 {"test.yaml:5:3: data.path", "'no/such/file.txt' does not exist"});
  expect_problem("model:\n  kind: gpt\ndata:\n  kind: tokens\n", {"data.path", "required for data.kind tokens"});
  expect_problem("checkpoint:\n  resume: runs/x/step_100\n", {"checkpoint.resume", "does not exist"});
  // Not checked when asked not to.
  EXPECT_NO_THROW(load_config_text("model:\n  kind: gpt\ndata:\n  kind: text\n  path: nope.txt\n", "t.yaml", {},
                                   {.check_files = false, .check_device = false}));
}

TEST(ConfigErrors, EveryProblemIsReportedAtOnce) {
  const std::string yaml = "model:\n  kindd: mlp\ntraining:\n  batch_size: -3\n  seed: x\noptim:\n  kind: rmsprop\n";
  auto p = problems_of(yaml, {"training.stepz=3"});
  ASSERT_EQ(p.size(), 5u);
  EXPECT_NE(p[0].find("test.yaml:2:3: model.kindd"), std::string::npos) << p[0];
  try {
    load_config_text(yaml, "test.yaml", {"training.stepz=3"}, kNoDevice);
  } catch (const ConfigError& e) {
    const std::string all = e.what();
    EXPECT_NE(all.find("invalid config (5 problems)"), std::string::npos) << all;
    EXPECT_NE(all.find("training.batch_size"), std::string::npos);
    EXPECT_NE(all.find("training.seed"), std::string::npos);
    EXPECT_NE(all.find("optim.kind"), std::string::npos);
    EXPECT_NE(all.find("override #1 'training.stepz=3': training.stepz: unknown key; did you mean 'training.steps'?"),
              std::string::npos)
        << all;
  }
}

TEST(ConfigErrors, MalformedYamlNamesFileAndLine) {
  expect_problem("model:\n  kind: mlp\n  mlp: {hidden: [1, 2\n", {"test.yaml:", "malformed YAML"});
  expect_problem("model:\n  kind: mlp\n kind: gpt\n", {"test.yaml:3", "malformed YAML"});
  expect_problem("training:\n  steps: 5\n  steps: 6\n",
                 {"test.yaml:3:3: training.steps: duplicate key (first set at test.yaml:2:3)"});
}

TEST(ConfigErrors, BadOverrides) {
  expect_problem("", {"override #1 'training.steps'", "expected key.path=value"}, {"training.steps"});
  expect_problem("", {"override #1 'training.stepz=4'", "did you mean 'training.steps'?"}, {"training.stepz=4"});
  expect_problem("", {"override #1 'training=4'", "training: is a section", "steps, epochs"}, {"training=4"});
  expect_problem("", {"override #1 'training.steps=abc'", "expected an integer >= 0, got 'abc'"},
                 {"training.steps=abc"});
  expect_problem("training:\n  steps: 5\n", {"'+' adds a key", "test.yaml:2:3 sets it"}, {"+training.steps=3"});
  expect_problem("", {"'a..b' is not a dotted key path"}, {"a..b=1"});
}

// With `switch_on` (e.g. "training.cuda_graph=true") set, each case's overrides give exactly one problem,
// which names the switch's key and contains the case's message.
using RefusalCases = std::vector<std::pair<std::vector<std::string>, std::string>>;
void expect_refusals(const std::string& switch_on, const RefusalCases& cases) {
  const std::string key = switch_on.substr(0, switch_on.find('='));
  for (const auto& [overrides, message] : cases) {
    std::vector<std::string> o = overrides;
    o.push_back(switch_on);
    auto p = problems_of("", o, kNoDevice);
    ASSERT_EQ(p.size(), 1u) << message;
    EXPECT_NE(p[0].find(key), std::string::npos) << p[0];
    EXPECT_NE(p[0].find(message), std::string::npos) << p[0];
  }
}

// What a replayed CUDA graph cannot redo is refused with the reason, each naming training.cuda_graph.
TEST(ConfigErrors, CudaGraphRefusesWhatAReplayCannotRedo) {
  expect_refusals("training.cuda_graph=true",
                  {{{"training.device=cpu"}, "needs a GPU, but training.device is cpu"},
                   {{"training.grad_accum=2"}, "needs training.grad_accum 1, got 2"},
                   {{"training.precision=fp16"}, "cannot hold fp16's loss scale"}});
}

// ZeRO-1 reduce-scatters through NCCL or Gloo in the gradients' dtype and shards no loss scale.
TEST(ConfigErrors, ZeroRefusesWhatItCannotShard) {
  expect_refusals("distributed.strategy=zero",
                  {{{"training.precision=fp16"}, "needs bf16 or fp32"},
                   {{"distributed.comm_dtype=bf16"}, "needs distributed.comm_dtype fp32, got bf16"}});
}

// Gathered-input gradients shard Linear layers, one micro-batch at a time, in the compute dtype.
TEST(ConfigErrors, GatheredGradsRefuseWhatTheyCannotShard) {
  expect_refusals("distributed.strategy=gathered_grads",
                  {{{"model.kind=gpt", "data.kind=synthetic_tokens"}, "needs model.kind mlp, got gpt"},
                   {{"training.precision=fp16"}, "needs bf16 or fp32"},
                   {{"training.grad_accum=2"}, "needs training.grad_accum 1, got 2"},
                   {{"distributed.comm_dtype=bf16"}, "needs distributed.comm_dtype fp32, got bf16"}});
}

// The copy engines move a sharded optimizer's collectives between GPUs: nothing else, nowhere else.
TEST(ConfigErrors, CopyEnginesNeedAShardedOptimizerOnGpus) {
  expect_refusals("distributed.copy_engines=true",
                  {{{}, "needs distributed.strategy zero or gathered_grads"},
                   {{"distributed.strategy=zero", "training.device=cpu"}, "training.device is cpu"}});
}

TEST(ConfigErrors, CudaWithoutAGpuIsAnError) {
  if (dpt::cuda::is_available()) GTEST_SKIP() << "a GPU is present";
  auto p = problems_of("training:\n  device: cuda\n", {}, LoadOptions{});
  ASSERT_EQ(p.size(), 1u);
  EXPECT_NE(p[0].find("no CUDA device is available"), std::string::npos) << p[0];
}

TEST(Config, ResolvedYamlLoadsBackToTheSameConfig) {
  Config c = load_config_text(
      "model:\n  kind: gpt\ndata:\n  kind: synthetic_tokens\n", "configs/x.yaml",
      {"optim.lr=0.000123", "model.gpt.dropout=0.1", "data.shuffle=false", "training.precision=bf16"}, kNoDevice);
  const std::string yaml = to_yaml(c);
  EXPECT_NE(yaml.find("# Resolved dptrain config from configs/x.yaml"), std::string::npos);
  EXPECT_NE(yaml.find("--set optim.lr=0.000123"), std::string::npos);
  Config again = load_config_text(yaml, "runs/x/config.yaml", {}, kNoDevice);
  EXPECT_EQ(again.model.kind, "gpt");
  EXPECT_DOUBLE_EQ(again.optim.lr, 0.000123);
  EXPECT_DOUBLE_EQ(again.model.gpt.dropout, 0.1);
  EXPECT_FALSE(again.data.shuffle);
  EXPECT_EQ(again.training.precision, "bf16");
  EXPECT_EQ(again.data.path, c.data.path);
  EXPECT_EQ(again.checkpoint.dir, "runs/x");
  // Same values, key for key (ignoring the provenance header).
  auto body = [](const std::string& s) { return s.substr(s.find("\nmodel:")); };
  EXPECT_EQ(body(to_yaml(again)), body(yaml));
}

// The header names the overrides in comments; a value with a line break must not end its comment.
TEST(Config, AnOverrideWithALineBreakStaysInTheResolvedYamlsComment) {
  Config c =
      load_config_text("", "t.yaml", {"data.path=/data/a:\nlogging:\r  every: 3", "training.steps=7"}, kNoDevice);
  Config again = load_config_text(to_yaml(c), "resolved.yaml", {}, kNoDevice);
  EXPECT_EQ(again.data.path, "/data/a:\nlogging:\r  every: 3");
  EXPECT_EQ(again.logging.every, c.logging.every);
  EXPECT_EQ(again.training.steps, 7);
}

TEST(Config, WriteConfigCreatesTheFile) {
  ScratchDir dir;
  Config c = load_config_text("", "t.yaml", {"training.steps=7"}, kNoDevice);
  write_config(c, dir.file("run/config.yaml"));
  Config back = load_config(dir.file("run/config.yaml"), {}, kNoDevice);
  EXPECT_EQ(back.training.steps, 7);
  expect_problem("", {}, {"x"});  // (sanity: a bad override alone is one problem)
}

TEST(Config, MissingConfigFileIsAClearError) {
  try {
    load_config("no/such/config.yaml");
    FAIL() << "expected an error";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("no/such/config.yaml: config file does not exist"), std::string::npos);
  }
}

TEST(Config, RelativeDataPathsAreFoundBesideTheConfig) {
  ScratchDir dir;
  dir.write("corpus.txt", "hello there, general");
  const std::string cfg =
      dir.write("configs/c.yaml", "model: {kind: gpt}\ndata:\n  kind: text\n  path: corpus.txt\n  seq_len: 4\n");
  Config c = load_config(cfg, {}, kNoDevice);
  EXPECT_EQ(c.data.path, dir.file("corpus.txt"));
}

TEST(Config, ReferenceListsEveryKey) {
  const std::string ref = config_reference();
  for (const auto& key : config_keys()) EXPECT_NE(ref.find("`" + key + "`"), std::string::npos) << key;
  EXPECT_NE(ref.find("| `distributed.bucket_cap_mb` | number | `25` | a number in (0, 65536]"), std::string::npos)
      << ref;
  EXPECT_GE(config_keys().size(), 60u);
}

TEST(ShippedConfigs, EveryOneValidates) {
  ScratchDir dir;
  // gpt2_124m.yaml reads token files the user provides; stand in two small ones.
  data::write_token_file(dir.file("train.bin"), data::synthetic_tokens(5000, 50257, 1));
  data::write_token_file(dir.file("val.bin"), data::synthetic_tokens(3000, 50257, 2));
  int count = 0;
  for (const auto& entry : fs::directory_iterator(fs::path(DPT_SOURCE_DIR) / "configs")) {
    if (entry.path().extension() != ".yaml") continue;
    const std::string path = entry.path().string();
    Config peek = load_config(path, {}, {.check_files = false, .check_device = false});
    std::vector<std::string> overrides;
    if (peek.data.kind == "tokens")
      overrides = {"data.path=" + dir.file("train.bin"), "data.val_path=" + dir.file("val.bin")};
    EXPECT_NO_THROW(load_config(path, overrides, kNoDevice)) << path;
    ++count;
  }
  EXPECT_GE(count, 7);
  for (const char* name : {"mlp_synthetic", "char_gpt", "gpt2_124m", "cnn_synthetic", "bench_gpt2_124m",
                           "bench_mlp_92m", "bench_tiny_gpt"}) {
    EXPECT_TRUE(fs::exists(fs::path(DPT_SOURCE_DIR) / "configs" / (std::string(name) + ".yaml"))) << name;
  }
}

TEST(ShippedConfigs, DefaultConfigIsSmallAndOnCpuFriendlySizes) {
  Config c = load_config(std::string(DPT_SOURCE_DIR) + "/configs/mlp_synthetic.yaml", {}, kNoDevice);
  EXPECT_EQ(c.model.kind, "mlp");
  EXPECT_EQ(c.training.device, "auto");
  EXPECT_EQ(c.checkpoint.dir, "runs/mlp_synthetic");
  EXPECT_LE(c.training.steps * c.training.batch_size, 100000);
}

}  // namespace
}  // namespace dpt::train
