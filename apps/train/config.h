#pragma once
// The trainer's configuration: a typed struct, loaded from YAML plus `--set key.path=value`
// overrides, validated as a whole before any work starts.
//
// Loading collects EVERY problem — unknown key (with a did-you-mean), wrong type, value out of range,
// missing file, inconsistent combination, malformed YAML — and throws one ConfigError listing them,
// each naming the dotted key path, where the value came from (file:line:col, or "override #k"), and
// what is allowed. The reference of all keys (config_reference()) is generated from the same schema
// that validates, so the documentation cannot drift from the code.
//
// Overrides follow Hydra's conventions: `a.b=v` sets a known key (every key of the schema exists,
// with its default), `+a.b=v` adds a key the file does not set (an error if it does), `++a.b=v` sets
// it either way; list items by index, `model.mlp.hidden.0=128`; values may contain '='; a value is
// parsed as YAML (`model.mlp.hidden=[256,256]`).
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"

namespace dpt::train {

struct MlpConfig {
  std::vector<int64_t> hidden = {64, 64};  // widths of the hidden layers; input and output come from the data
  std::string activation = "relu";
};

struct GptConfig {
  int64_t vocab_size = 0;  // 0: from the data (text vocabulary, or data.vocab_size)
  int64_t block_size = 0;  // 0: data.seq_len
  int64_t n_layer = 4;
  int64_t n_head = 4;
  int64_t n_embd = 128;
  double dropout = 0.0;
  bool bias = true;         // biases in the Linears and LayerNorms
  std::string ffn = "mlp";  // each block's feed-forward (layers/feed_forward.h): mlp | swiglu
};

struct CnnConfig {
  std::vector<int64_t> channels = {16, 32};  // one conv (3x3, same padding) + ReLU + 2x2 max-pool per entry
  int64_t kernel_size = 3;
  int64_t hidden = 64;  // width of the fully connected layer before the classifier
};

struct ModelConfig {
  std::string kind = "mlp";  // mlp | gpt | cnn, or a registered model (apps/train/components.h)
  MlpConfig mlp;
  GptConfig gpt;
  CnnConfig cnn;
  // gpt: starting weights (apps/train/hf_gpt2.h): a Hugging Face GPT-2 folder (config.json +
  // model.safetensors) or a .safetensors file of a nanoGPT state dict; "" trains from scratch.
  std::string init_from;
};

struct DataConfig {
  // synthetic_classification | synthetic_regression | synthetic_images | synthetic_tokens | tokens | text | mnist,
  // or a registered dataset (apps/train/components.h)
  std::string kind = "synthetic_classification";
  std::string path;         // tokens: .bin file; text: plain text; mnist: images idx; synthetic_tokens: where to write
  std::string val_path;     // tokens: validation .bin (else the last val_fraction of `path`); mnist: val images
  std::string labels_path;  // mnist: labels idx
  std::string val_labels_path;
  double val_fraction = 0.1;      // text/tokens without val_path: the tail kept for evaluation
  int64_t seq_len = 64;           // gpt: tokens per example
  std::string window = "random";  // gpt: random | sequential
  // synthetic_*:
  int64_t num_samples = 2048;
  int64_t num_features = 2;
  int64_t num_classes = 3;
  int64_t num_outputs = 1;
  std::string pattern = "spirals";  // synthetic_classification: spirals | clusters
  double noise = 0.2;
  int64_t image_size = 16;  // synthetic_images: H = W
  int64_t image_channels = 1;
  // synthetic_tokens:
  int64_t vocab_size = 256;
  int64_t num_tokens = 1000000;
  // loader:
  bool shuffle = true;
  int64_t prefetch = 2;
};

struct TrainingConfig {
  int64_t steps = 200;  // optimizer steps; setting epochs (> 0) instead makes steps 0 (derived from epochs)
  int64_t epochs = 0;
  int64_t batch_size = 32;         // per process (per GPU), per micro-batch
  int64_t grad_accum = 1;          // micro-batches per optimizer step
  std::string precision = "auto";  // auto (bf16 on a GPU, fp32 on the CPU) | fp32 | bf16 | fp16
  int64_t seed = 0;
  std::string device = "auto";  // auto | cpu | cuda | cuda:N (auto: the local rank's GPU when there is one)
  double grad_clip = 1.0;       // max global gradient norm; 0 disables clipping
  int64_t max_bad_steps = 10;   // non-finite loss/grad-norm steps skipped before the run stops
  // forward + backward replayed from a CUDA graph (apps/train/step_graph.h): true, false, or auto (whenever
  // the run allows it: a GPU, grad_accum 1, bf16 or fp32, DDP's collectives on NCCL)
  std::string cuda_graph = "auto";
};

struct OptimConfig {
  std::string kind = "adamw";  // adamw | adam | sgd, or a registered optimizer (apps/train/components.h)
  double lr = 1e-3;
  double weight_decay = 0.0;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double momentum = 0.0;  // sgd
  bool nesterov = false;  // sgd
};

struct ScheduleConfig {
  std::string kind = "constant";  // constant | cosine | step, or a registered schedule (apps/train/components.h)
  int64_t warmup_steps = 0;       // cosine
  double min_lr = 0.0;            // cosine: the floor reached at the last step
  int64_t step_size = 1000;       // step: decay period
  double gamma = 0.1;             // step: decay factor
};

struct DistributedConfig {
  std::string backend = "auto";  // auto (nccl on GPU, gloo on CPU) | nccl | gloo
  double bucket_cap_mb = 25.0;
  double first_bucket_mb = 1.0;
  std::string comm_dtype = "fp32";  // fp32 | bf16 (gradients communicated in bf16, accumulated in fp32)
  bool find_unused_parameters = false;
  // How gradients are exchanged (docs/distributed.md): auto (chosen for the model, precision and machine;
  // the run's first lines say what and why) | allreduce | zero (ZeRO-1: optimizer state and update sharded
  // across ranks) | gathered_grads (ZeRO-1 for MLPs, weight gradients formed from gathered layer inputs).
  std::string strategy = "auto";
  // With zero on GPUs: the sharded buckets move by the copy engines. auto: when every rank is on one node.
  std::string copy_engines = "auto";
  int64_t timeout_s = 300;    // collective/rendezvous deadline before a rank gives up
  bool debug_checks = false;  // verify before each collective that all ranks agree on (seq, op, count, dtype)
};

struct CheckpointConfig {
  std::string dir;              // default runs/<config file stem>; also holds the resolved config and metrics
  int64_t every = 0;            // steps between checkpoints; 0: only at the end
  int64_t keep = 3;             // newest checkpoints kept
  std::string resume = "auto";  // auto | never | <path of a checkpoint>
  bool enabled = true;          // false: neither save nor resume (benchmarks)
  // refuse | allow: resuming a checkpoint whose computation settings differ (apps/train/run_settings.h)
  std::string resume_changed = "refuse";
};

struct LoggingConfig {
  int64_t every = 10;          // steps between log lines
  std::string metrics_file;    // default <checkpoint.dir>/metrics.jsonl
  std::string level = "info";  // debug | info | warn | error
  bool progress_bar = true;    // only when stdout is a terminal
  bool csv = false;            // also metrics.csv beside the metrics file (metrics_log_csv.h)
  bool tensorboard = false;    // also a TensorBoard event file beside it (metrics_log_tensorboard.h)
};

struct EvalConfig {
  int64_t every = 0;            // steps between evaluations; 0: only at the end
  int64_t batches = 10;         // validation batches per evaluation
  int64_t sample_tokens = 200;  // gpt: length of the text sample printed at the end; 0: none
};

// Values of the settings that registered components declare (apps/train/components.h), by full key
// ("optim.lion.beta2"), in the map of their type (String and Choice in `strings`). A default-constructed
// one holds every registered default.
struct ComponentSettings {
  ComponentSettings();
  std::map<std::string, int64_t> ints;
  std::map<std::string, double> floats;
  std::map<std::string, bool> bools;
  std::map<std::string, std::string> strings;
};

struct Config {
  ModelConfig model;
  DataConfig data;
  TrainingConfig training;
  OptimConfig optim;
  ScheduleConfig schedule;
  DistributedConfig distributed;
  CheckpointConfig checkpoint;
  LoggingConfig logging;
  EvalConfig eval;
  ComponentSettings components;

  // Provenance (not keys): the file and overrides this config came from.
  std::string source_file;
  std::vector<std::string> overrides;
};

// One problem per entry, e.g. "configs/x.yaml:4:3: model.gpt.n_layr: unknown key; did you mean
// 'model.gpt.n_layer'?". what() lists them all.
class ConfigError : public Error {
 public:
  explicit ConfigError(std::vector<std::string> problems);
  const std::vector<std::string>& problems() const { return problems_; }

 private:
  std::vector<std::string> problems_;
};

struct LoadOptions {
  bool check_files = true;   // input files must exist (off for tools that only inspect a config)
  bool check_device = true;  // training.device: cuda must have a GPU
};

// Reads `path` (YAML), applies `overrides` ("key.path=value"), validates, fills defaults and derived
// values (checkpoint.dir, logging.metrics_file, paths resolved). Throws ConfigError.
Config load_config(const std::string& path, const std::vector<std::string>& overrides = {},
                   const LoadOptions& options = {});
// The same from YAML text; `name` stands for the file in messages and its directory anchors relative paths.
Config load_config_text(const std::string& yaml, const std::string& name,
                        const std::vector<std::string>& overrides = {}, const LoadOptions& options = {});

// The resolved config as YAML (every key, defaults included): loading it gives the same Config.
std::string to_yaml(const Config& config);
// Writes to_yaml(config) to `path` atomically (temp file + rename).
void write_config(const Config& config, const std::string& path);

// Markdown table of every key: type, default, allowed values, meaning.
std::string config_reference();
// Every dotted key of the schema, in order.
std::vector<std::string> config_keys();
// Every key with its value as one line of YAML (lists in flow style), in schema order.
std::vector<std::pair<std::string, std::string>> config_values(const Config& config);

// Levenshtein distance, used for did-you-mean suggestions.
size_t edit_distance(const std::string& a, const std::string& b);

}  // namespace dpt::train
