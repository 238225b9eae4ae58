#include "config.h"

#include <unistd.h>
#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <sstream>

#include "components.h"
#include "core/cuda_runtime.h"
#include "data/token_shards.h"

namespace dpt::train {

namespace fs = std::filesystem;

// ------------------------------------------------------------------------------------------------
// The schema: one entry per key. `ref` points into a Config; the kind says what the pointer is:
// Int -> int64_t, Float -> double, Bool -> bool, String/Choice -> std::string, IntList -> vector<int64_t>.
namespace {

enum class Kind { Int, Float, Bool, String, Choice, IntList };

struct Spec {
  std::vector<std::string> choices{};
  std::optional<double> min{};
  bool min_exclusive = false;
  std::optional<double> max{};
  bool max_exclusive = false;
  std::string help{};
};

struct Field {
  std::string path;
  Kind kind;
  Spec spec;
  std::function<void*(Config&)> ref;

  template <class T>
  T& get(Config& c) const {
    return *static_cast<T*>(ref(c));
  }
  template <class T>
  const T& get(const Config& c) const {
    return *static_cast<T*>(ref(const_cast<Config&>(c)));
  }
};

Kind kind_of(SettingSpec::Type type) {
  switch (type) {
    case SettingSpec::Type::Int:
      return Kind::Int;
    case SettingSpec::Type::Float:
      return Kind::Float;
    case SettingSpec::Type::Bool:
      return Kind::Bool;
    case SettingSpec::Type::String:
      return Kind::String;
    case SettingSpec::Type::Choice:
      return Kind::Choice;
  }
  return Kind::String;
}

// Where a registered setting's value lives: the map of its type in Config::components.
std::function<void*(Config&)> component_ref(const std::string& key, Kind kind) {
  switch (kind) {
    case Kind::Int:
      return [key](Config& c) -> void* { return &c.components.ints[key]; };
    case Kind::Float:
      return [key](Config& c) -> void* { return &c.components.floats[key]; };
    case Kind::Bool:
      return [key](Config& c) -> void* { return &c.components.bools[key]; };
    default:
      return [key](Config& c) -> void* { return &c.components.strings[key]; };
  }
}

std::optional<std::string> assign(const Field& f, const YAML::Node& node, Config& c);

// The registries' part of the schema (apps/train/components.h): each kind key allows the registered
// names after its built-in ones, and each registered setting becomes a key placed after the last key of
// its section, so the reference lists it where a reader looks. A default that its own spec rejects is a
// programming error, reported at the first use of the schema.
void add_registered(std::vector<Field>& s) {
  for (Field& f : s) {
    if (f.kind != Kind::Choice) continue;
    for (const RegisteredComponent& c : registered_components(f.path))
      if (std::find(f.spec.choices.begin(), f.spec.choices.end(), c.name) == f.spec.choices.end())
        f.spec.choices.push_back(c.name);
  }
  for (const RegisteredSetting& r : registered_settings()) {
    const Kind kind = kind_of(r.spec.type);
    Field field{r.key, kind, Spec{.choices = r.spec.choices, .min = r.spec.min, .max = r.spec.max, .help = r.spec.help},
                component_ref(r.key, kind)};
    Config probe;
    if (auto problem = assign(field, YAML::Node(r.spec.default_value), probe))
      DPT_FAIL("registered setting {}: default '{}': {}", r.key, r.spec.default_value, *problem);
    const std::string section = r.key.substr(0, r.key.find('.') + 1);
    auto last = s.end();
    for (auto it = s.begin(); it != s.end(); ++it)
      if (it->path.rfind(section, 0) == 0) last = it + 1;
    s.insert(last, std::move(field));
  }
}

std::vector<Field> build_schema() {
  std::vector<Field> s;
  auto add = [&](Kind kind, const char* path, std::function<void*(Config&)> ref, Spec spec) {
    s.push_back({path, kind, std::move(spec), std::move(ref)});
  };
#define DPT_KEY(kind, path, member, ...) \
  add(                                   \
      Kind::kind, path, [](Config& c) -> void* { return &c.member; }, Spec{__VA_ARGS__})

  DPT_KEY(Choice, "model.kind", model.kind, .choices = {"mlp", "gpt", "cnn"}, .help = "model family");
  DPT_KEY(IntList, "model.mlp.hidden", model.mlp.hidden, .min = 1, .help = "hidden layer widths");
  DPT_KEY(Choice, "model.mlp.activation", model.mlp.activation, .choices = {"relu", "gelu", "tanh"},
          .help = "activation between layers");
  DPT_KEY(Int, "model.gpt.vocab_size", model.gpt.vocab_size, .min = 0, .max = 1 << 20,
          .help = "embedding rows; 0: from the data");
  DPT_KEY(Int, "model.gpt.block_size", model.gpt.block_size, .min = 0, .max = 1 << 20,
          .help = "longest sequence; 0: data.seq_len");
  DPT_KEY(Int, "model.gpt.n_layer", model.gpt.n_layer, .min = 1, .max = 1024, .help = "transformer blocks");
  DPT_KEY(Int, "model.gpt.n_head", model.gpt.n_head, .min = 1, .max = 1024, .help = "attention heads");
  DPT_KEY(Int, "model.gpt.n_embd", model.gpt.n_embd, .min = 1, .max = 1 << 16,
          .help = "model width (divisible by n_head)");
  DPT_KEY(Float, "model.gpt.dropout", model.gpt.dropout, .min = 0, .max = 1, .max_exclusive = true,
          .help = "dropout probability (embeddings, attention weights, both residual branches)");
  DPT_KEY(Bool, "model.gpt.bias", model.gpt.bias,
          .help = "biases in the Linears and LayerNorms; false as in nanoGPT's recipes");
  DPT_KEY(Choice, "model.gpt.ffn", model.gpt.ffn, .choices = {},
          .help = "each block's feed-forward (registered components: below)");
  DPT_KEY(IntList, "model.cnn.channels", model.cnn.channels, .min = 1,
          .help = "output channels of each conv + ReLU + 2x2 max-pool stage");
  DPT_KEY(Int, "model.cnn.kernel_size", model.cnn.kernel_size, .min = 1, .max = 15, .help = "conv kernel (odd)");
  DPT_KEY(Int, "model.cnn.hidden", model.cnn.hidden, .min = 1, .help = "fully connected width before the classifier");
  DPT_KEY(String, "model.init_from", model.init_from,
          .help = "gpt: start from these weights: a Hugging Face GPT-2 folder (config.json + model.safetensors) "
                  "or a .safetensors nanoGPT state dict; a resumed checkpoint takes precedence");

  DPT_KEY(Choice, "data.kind", data.kind,
          .choices = {"synthetic_classification", "synthetic_regression", "synthetic_images", "synthetic_tokens",
                      "tokens", "text", "mnist"},
          .help = "dataset");
  DPT_KEY(String, "data.path", data.path,
          .help = "tokens: .bin file, or a glob of shards (data/fineweb_train_*.bin: sorted, read as one stream, no "
                  "window crosses two); text: text file; mnist: images idx; synthetic_tokens: file to generate");
  DPT_KEY(String, "data.val_path", data.val_path,
          .help = "tokens: validation .bin or glob of shards; mnist: validation images (else a tail of the training "
                  "data)");
  DPT_KEY(String, "data.labels_path", data.labels_path, .help = "mnist: labels idx");
  DPT_KEY(String, "data.val_labels_path", data.val_labels_path, .help = "mnist: validation labels idx");
  DPT_KEY(Float, "data.val_fraction", data.val_fraction, .min = 0, .max = 0.5,
          .help = "tail of the data held out for evaluation when there is no val_path");
  DPT_KEY(Int, "data.seq_len", data.seq_len, .min = 1, .max = 1 << 20, .help = "gpt: tokens per example");
  DPT_KEY(Choice, "data.window", data.window, .choices = {"random", "sequential"},
          .help = "gpt: where examples start: random draws a fresh uniform start for every example of every "
                  "epoch, sequential tiles the stream");
  DPT_KEY(Int, "data.num_samples", data.num_samples, .min = 1, .max = 1LL << 32, .help = "synthetic: examples");
  DPT_KEY(Int, "data.num_features", data.num_features, .min = 1, .max = 1 << 24, .help = "synthetic: input width");
  DPT_KEY(Int, "data.num_classes", data.num_classes, .min = 2, .max = 1 << 24, .help = "synthetic: classes");
  DPT_KEY(Int, "data.num_outputs", data.num_outputs, .min = 1, .max = 1 << 24, .help = "synthetic_regression: outputs");
  DPT_KEY(Choice, "data.pattern", data.pattern, .choices = {"spirals", "clusters"},
          .help = "synthetic_classification: spirals (2 features) or Gaussian clusters");
  DPT_KEY(Float, "data.noise", data.noise, .min = 0, .max = 100, .help = "synthetic: noise stddev");
  DPT_KEY(Int, "data.image_size", data.image_size, .min = 4, .max = 4096, .help = "synthetic_images: height = width");
  DPT_KEY(Int, "data.image_channels", data.image_channels, .min = 1, .max = 64, .help = "synthetic_images: channels");
  DPT_KEY(Int, "data.vocab_size", data.vocab_size, .min = 2, .max = 65536, .help = "synthetic_tokens: vocabulary");
  DPT_KEY(Int, "data.num_tokens", data.num_tokens, .min = 2, .max = 2147483647LL,
          .help = "synthetic_tokens: tokens generated");
  DPT_KEY(Bool, "data.shuffle", data.shuffle, .help = "shuffle every epoch (seed + epoch)");
  DPT_KEY(Int, "data.prefetch", data.prefetch, .min = 0, .max = 64,
          .help = "batches prepared ahead by a background thread (not for data kept on the GPU); 0: no thread");

  DPT_KEY(Int, "training.steps", training.steps, .min = 0, .help = "optimizer steps (or set epochs)");
  DPT_KEY(Int, "training.epochs", training.epochs, .min = 0, .help = "passes over the data (instead of steps)");
  DPT_KEY(Int, "training.batch_size", training.batch_size, .min = 1,
          .help = "examples per process (per GPU) per micro-batch");
  DPT_KEY(Int, "training.grad_accum", training.grad_accum, .min = 1, .max = 1 << 16,
          .help = "micro-batches per optimizer step");
  DPT_KEY(Choice, "training.precision", training.precision, .choices = {"auto", "fp32", "bf16", "fp16"},
          .help = "compute precision; auto: bf16 (float32 masters) on a GPU, fp32 on the CPU; fp16: float32 "
                  "masters and dynamic loss scaling");
  DPT_KEY(Int, "training.seed", training.seed, .min = 0, .help = "seed of initialization, data order and dropout");
  DPT_KEY(String, "training.device", training.device, .help = "auto | cpu | cuda | cuda:N");
  DPT_KEY(Float, "training.grad_clip", training.grad_clip, .min = 0, .help = "max gradient norm; 0: off");
  DPT_KEY(Int, "training.max_bad_steps", training.max_bad_steps, .min = 0,
          .help = "non-finite steps skipped before stopping");
  DPT_KEY(Choice, "training.cuda_graph", training.cuda_graph, .choices = {"auto", "true", "false"},
          .help = "replay forward and backward (with DDP's AllReduces) from a CUDA graph after two eager steps: "
                  "true needs a GPU, grad_accum 1, bf16 or fp32; auto does it whenever the run allows it (also under DDP "
                  "on NCCL)");

  DPT_KEY(Choice, "optim.kind", optim.kind, .choices = {"adamw", "adam", "sgd"}, .help = "optimizer");
  DPT_KEY(Float, "optim.lr", optim.lr, .min = 0, .min_exclusive = true, .max = 100, .help = "peak learning rate");
  DPT_KEY(Float, "optim.weight_decay", optim.weight_decay, .min = 0, .max = 10, .help = "weight decay");
  DPT_KEY(Float, "optim.beta1", optim.beta1, .min = 0, .max = 1, .max_exclusive = true,
          .help = "adam: first-moment decay");
  DPT_KEY(Float, "optim.beta2", optim.beta2, .min = 0, .max = 1, .max_exclusive = true,
          .help = "adam: second-moment decay");
  DPT_KEY(Float, "optim.eps", optim.eps, .min = 0, .min_exclusive = true, .max = 1, .help = "adam: epsilon");
  DPT_KEY(Float, "optim.momentum", optim.momentum, .min = 0, .max = 1, .max_exclusive = true, .help = "sgd: momentum");
  DPT_KEY(Bool, "optim.nesterov", optim.nesterov, .help = "sgd: Nesterov momentum");

  DPT_KEY(Choice, "schedule.kind", schedule.kind, .choices = {"constant", "cosine", "step"},
          .help = "learning-rate schedule");
  DPT_KEY(Int, "schedule.warmup_steps", schedule.warmup_steps, .min = 0, .help = "cosine: linear warmup steps");
  DPT_KEY(Float, "schedule.min_lr", schedule.min_lr, .min = 0, .help = "cosine: final learning rate");
  DPT_KEY(Int, "schedule.step_size", schedule.step_size, .min = 1, .help = "step: steps between decays");
  DPT_KEY(Float, "schedule.gamma", schedule.gamma, .min = 0, .max = 1, .help = "step: decay factor");

  DPT_KEY(Choice, "distributed.backend", distributed.backend, .choices = {"auto", "nccl", "gloo"},
          .help = "collectives: auto = nccl on GPU, gloo on CPU");
  DPT_KEY(Float, "distributed.bucket_cap_mb", distributed.bucket_cap_mb, .min = 0, .min_exclusive = true, .max = 65536,
          .help = "gradient bucket size (MiB)");
  DPT_KEY(Float, "distributed.first_bucket_mb", distributed.first_bucket_mb, .min = 0, .min_exclusive = true,
          .max = 65536, .help = "size of the first bucket (MiB), small so communication starts early");
  DPT_KEY(Choice, "distributed.comm_dtype", distributed.comm_dtype, .choices = {"fp32", "bf16"},
          .help = "dtype gradients travel in");
  DPT_KEY(Bool, "distributed.find_unused_parameters", distributed.find_unused_parameters,
          .help = "allow parameters that get no gradient");
  DPT_KEY(Choice, "distributed.strategy", distributed.strategy,
          .choices = {"auto", "allreduce", "zero", "gathered_grads"},
          .help = "how gradients are exchanged: allreduce (DDP); zero (ZeRO-1: gradients reduce-scattered, each rank "
                  "updates and keeps optimizer state for 1/N of the parameters, then all-gathers them); "
                  "gathered_grads (ZeRO-1 for MLPs without reducing gradients: each layer's inputs and output "
                  "gradients are all-gathered and each rank forms the averaged gradient of its rows); auto = the "
                  "fastest measured for the model: gathered_grads for MLPs, zero for GPTs of 50M parameters or "
                  "more, allreduce otherwise, on CPUs and under fp16 (the run's first lines say which)");
  DPT_KEY(Choice, "distributed.copy_engines", distributed.copy_engines, .choices = {"auto", "true", "false"},
          .help = "with strategy zero or gathered_grads on GPUs of one host: the collectives move by the copy "
                  "engines (NCCL symmetric memory, zero-CTA policy), not by NCCL kernels beside backward's; under "
                  "zero it costs a receive buffer the size of the gradients; auto = when every rank is on one node");
  DPT_KEY(Int, "distributed.timeout_s", distributed.timeout_s, .min = 1, .max = 86400,
          .help = "seconds a collective or rendezvous may take before the rank fails");
  DPT_KEY(Bool, "distributed.debug_checks", distributed.debug_checks,
          .help = "check before each collective that all ranks agree");

  DPT_KEY(String, "checkpoint.dir", checkpoint.dir,
          .help = "run directory (checkpoints, resolved config, metrics); default runs/<config name>");
  DPT_KEY(Int, "checkpoint.every", checkpoint.every, .min = 0, .help = "steps between checkpoints; 0: at the end");
  DPT_KEY(Int, "checkpoint.keep", checkpoint.keep, .min = 1, .max = 1000, .help = "newest checkpoints kept");
  DPT_KEY(String, "checkpoint.resume", checkpoint.resume,
          .help = "auto (newest valid checkpoint in dir) | never | path of a checkpoint");
  DPT_KEY(Bool, "checkpoint.enabled", checkpoint.enabled,
          .help = "false: save no checkpoints and resume from none (benchmark runs)");
  DPT_KEY(Choice, "checkpoint.resume_changed", checkpoint.resume_changed, .choices = {"refuse", "allow"},
          .help = "a checkpoint whose model, data, optim, schedule, precision, batch, seed or world size settings "
                  "differ from this config's: refuse (stop, naming each key) or allow (warn and resume)");

  DPT_KEY(Int, "logging.every", logging.every, .min = 1, .help = "steps between log lines");
  DPT_KEY(String, "logging.metrics_file", logging.metrics_file, .help = "JSONL metrics; default <dir>/metrics.jsonl; a failed write stops the run");
  DPT_KEY(Choice, "logging.level", logging.level, .choices = {"debug", "info", "warn", "error"}, .help = "log level");
  DPT_KEY(Bool, "logging.progress_bar", logging.progress_bar, .help = "progress bar when attached to a terminal");
  DPT_KEY(Bool, "logging.csv", logging.csv,
          .help = "also write the metrics as CSV: metrics.csv beside the metrics file, one row per record");
  DPT_KEY(Bool, "logging.tensorboard", logging.tensorboard,
          .help = "also write a TensorBoard event file (events.out.tfevents.*) beside the metrics file: train/loss, "
                  "train/lr, train/grad_norm, train/throughput, val/loss, val/perplexity (language models), val/accuracy (classifiers)");

  DPT_KEY(Int, "eval.every", eval.every, .min = 0, .help = "steps between evaluations; 0: at the end only");
  DPT_KEY(Int, "eval.batches", eval.batches, .min = 1,
          .help = "validation batches per evaluation; the loss is their mean (gpt with random windows: that many "
                  "random windows of the held-out data, the same ones each time)");
  DPT_KEY(Int, "eval.sample_tokens", eval.sample_tokens, .min = 0, .help = "gpt: tokens of text sampled at the end");
#undef DPT_KEY
  add_registered(s);
  return s;
}

const std::vector<Field>& schema() {
  static const std::vector<Field> s = build_schema();
  return s;
}

const Field* find_field(const std::string& path) {
  for (const Field& f : schema())
    if (f.path == path) return &f;
  return nullptr;
}

std::string parent_of(const std::string& path) {
  auto dot = path.rfind('.');
  return dot == std::string::npos ? "" : path.substr(0, dot);
}

std::string leaf_of(const std::string& path) {
  auto dot = path.rfind('.');
  return dot == std::string::npos ? path : path.substr(dot + 1);
}

// Every section path ("model", "model.gpt", ...) — the proper prefixes of the keys.
const std::set<std::string>& sections() {
  static const std::set<std::string> s = [] {
    std::set<std::string> out;
    for (const Field& f : schema())
      for (std::string p = parent_of(f.path); !p.empty(); p = parent_of(p)) out.insert(p);
    return out;
  }();
  return s;
}

bool is_section(const std::string& path) { return path.empty() || sections().count(path) > 0; }

// The direct children of a section, in schema order.
std::vector<std::string> children_of(const std::string& section) {
  std::vector<std::string> out;
  auto push = [&](const std::string& child) {
    if (std::find(out.begin(), out.end(), child) == out.end()) out.push_back(child);
  };
  for (const Field& f : schema()) {
    for (std::string p = f.path; !p.empty(); p = parent_of(p)) {
      if (parent_of(p) == section) push(leaf_of(p));
    }
  }
  return out;
}

std::string join(const std::vector<std::string>& items, const char* sep = ", ") {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) out += (i ? sep : "") + items[i];
  return out;
}

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

size_t suggestion_threshold(const std::string& s) { return std::clamp<size_t>((s.size() + 1) / 3, 1, 3); }

// The closest known key to an unknown `path`: a sibling first, then a key of the same name anywhere,
// then the whole dotted path.
std::optional<std::string> suggest_key(const std::string& path) {
  const std::string parent = parent_of(path), leaf = lower(leaf_of(path));
  std::optional<std::string> best;
  size_t best_distance = suggestion_threshold(leaf) + 1;
  for (const std::string& child : children_of(parent)) {
    size_t d = edit_distance(leaf, lower(child));
    if (d < best_distance) best_distance = d, best = parent.empty() ? child : parent + "." + child;
  }
  if (best) return best;
  std::vector<std::string> all;
  for (const Field& f : schema()) all.push_back(f.path);
  for (const std::string& s : sections()) all.push_back(s);
  for (const std::string& candidate : all) {
    size_t d = edit_distance(leaf, lower(leaf_of(candidate)));
    if (d < best_distance || (d == best_distance && best && candidate.size() < best->size()))
      best_distance = d, best = candidate;
  }
  if (best) return best;
  best_distance = suggestion_threshold(path) + 1;
  for (const std::string& candidate : all) {
    size_t d = edit_distance(lower(path), lower(candidate));
    if (d < best_distance) best_distance = d, best = candidate;
  }
  return best;
}

std::string unknown_key_message(const std::string& path) {
  std::string message = "unknown key";
  if (auto s = suggest_key(path)) message += fmt::format("; did you mean '{}'?", *s);
  const std::string parent = parent_of(path);
  if (is_section(parent)) {
    message += fmt::format(" Keys of {}: {}", parent.empty() ? "the top level" : "'" + parent + "'",
                           join(children_of(parent)));
  }
  return message;
}

const char* kind_name(Kind k) {
  switch (k) {
    case Kind::Int:
      return "integer";
    case Kind::Float:
      return "number";
    case Kind::Bool:
      return "boolean";
    case Kind::String:
      return "string";
    case Kind::Choice:
      return "choice";
    case Kind::IntList:
      return "list of integers";
  }
  return "?";
}

std::string format_number(double v) { return fmt::format("{}", v); }

std::string range_text(const Spec& spec) {
  if (spec.min && spec.max)
    return fmt::format("in {}{}, {}{}", spec.min_exclusive ? "(" : "[", format_number(*spec.min),
                       format_number(*spec.max), spec.max_exclusive ? ")" : "]");
  if (spec.min) return fmt::format("{} {}", spec.min_exclusive ? ">" : ">=", format_number(*spec.min));
  if (spec.max) return fmt::format("{} {}", spec.max_exclusive ? "<" : "<=", format_number(*spec.max));
  return "";
}

// What the key allows, for messages and the reference table.
std::string allowed_text(const Field& f) {
  switch (f.kind) {
    case Kind::Choice:
      return "one of " + join(f.spec.choices, " | ");
    case Kind::Bool:
      return "true | false";
    case Kind::Int:
    case Kind::Float: {
      std::string noun = f.kind == Kind::Int ? "an integer" : "a number";
      std::string r = range_text(f.spec);
      return r.empty() ? noun : noun + " " + r;
    }
    case Kind::IntList: {
      std::string r = range_text(f.spec);
      return r.empty() ? "a list of integers" : "a list of integers " + r;
    }
    case Kind::String:
      return "a string";
  }
  return "";
}

std::string node_shape(const YAML::Node& n) {
  if (n.IsMap()) return "a mapping";
  if (n.IsSequence()) return "a list";
  if (n.IsNull()) return "nothing";
  return "'" + n.Scalar() + "'";
}

std::optional<double> parse_double(const std::string& s) {
  if (s.empty()) return std::nullopt;
  char* end = nullptr;
  errno = 0;
  double v = std::strtod(s.c_str(), &end);
  if (end != s.c_str() + s.size() || errno == ERANGE || !std::isfinite(v)) return std::nullopt;
  return v;
}

std::optional<int64_t> parse_int(const std::string& s) {
  int64_t v = 0;
  const char* begin = s.data() + (s.size() > 1 && s[0] == '+' ? 1 : 0);
  auto [ptr, ec] = std::from_chars(begin, s.data() + s.size(), v);
  if (ec == std::errc() && ptr == s.data() + s.size()) return v;
  // 1e6 and 2.0 are integers too, when exact.
  if (auto d = parse_double(s); d && std::floor(*d) == *d && std::abs(*d) < 9.0e15) return static_cast<int64_t>(*d);
  return std::nullopt;
}

std::optional<bool> parse_bool(const std::string& s) {
  const std::string l = lower(s);
  if (l == "true" || l == "yes" || l == "on") return true;
  if (l == "false" || l == "no" || l == "off") return false;
  return std::nullopt;
}

std::optional<std::string> check_range(const Field& f, double v) {
  const Spec& s = f.spec;
  const bool below = s.min && (s.min_exclusive ? v <= *s.min : v < *s.min);
  const bool above = s.max && (s.max_exclusive ? v >= *s.max : v > *s.max);
  if (below || above) return fmt::format("expected {}, got {}", allowed_text(f), format_number(v));
  return std::nullopt;
}

// Converts `node` into the field's member of `c`; returns the problem, if any. A null value (`key:`
// with nothing after it) keeps the default.
std::optional<std::string> assign(const Field& f, const YAML::Node& node, Config& c) {
  if (!node.IsDefined() || node.IsNull()) return std::nullopt;
  if (f.kind == Kind::IntList) {
    if (!node.IsSequence()) return fmt::format("expected {}, got {}", allowed_text(f), node_shape(node));
    std::vector<int64_t> values;
    for (size_t i = 0; i < node.size(); ++i) {
      const YAML::Node item = node[i];
      std::optional<int64_t> v = item.IsScalar() ? parse_int(item.Scalar()) : std::nullopt;
      if (!v) return fmt::format("item {}: expected an integer, got {}", i, node_shape(item));
      if (auto p = check_range(f, static_cast<double>(*v))) return fmt::format("item {}: {}", i, *p);
      values.push_back(*v);
    }
    if (values.empty() && f.path == "model.cnn.channels") return std::string("expected at least one stage");
    f.get<std::vector<int64_t>>(c) = values;
    return std::nullopt;
  }
  if (!node.IsScalar()) return fmt::format("expected {}, got {}", allowed_text(f), node_shape(node));
  const std::string& text = node.Scalar();
  switch (f.kind) {
    case Kind::Int: {
      auto v = parse_int(text);
      if (!v) return fmt::format("expected {}, got '{}'", allowed_text(f), text);
      if (auto p = check_range(f, static_cast<double>(*v))) return p;
      f.get<int64_t>(c) = *v;
      return std::nullopt;
    }
    case Kind::Float: {
      auto v = parse_double(text);
      if (!v) return fmt::format("expected {} (finite), got '{}'", allowed_text(f), text);
      if (auto p = check_range(f, *v)) return p;
      f.get<double>(c) = *v;
      return std::nullopt;
    }
    case Kind::Bool: {
      auto v = parse_bool(text);
      if (!v) return fmt::format("expected true or false, got '{}'", text);
      f.get<bool>(c) = *v;
      return std::nullopt;
    }
    case Kind::Choice: {
      if (std::find(f.spec.choices.begin(), f.spec.choices.end(), text) == f.spec.choices.end()) {
        std::string message = fmt::format("expected {}, got '{}'", allowed_text(f), text);
        size_t best = suggestion_threshold(text) + 1;
        std::string guess;
        for (const auto& choice : f.spec.choices) {
          size_t d = edit_distance(lower(text), choice);
          if (d < best) best = d, guess = choice;
        }
        if (!guess.empty()) message += fmt::format("; did you mean '{}'?", guess);
        return message;
      }
      f.get<std::string>(c) = text;
      return std::nullopt;
    }
    case Kind::String:
      f.get<std::string>(c) = text;
      return std::nullopt;
    case Kind::IntList:
      break;
  }
  return std::nullopt;
}

// The value of a field as a YAML node (for writing, and as the base of list-item overrides).
YAML::Node to_node(const Field& f, const Config& c) {
  YAML::Node n;
  switch (f.kind) {
    case Kind::Int:
      n = f.get<int64_t>(c);
      break;
    case Kind::Float:
      n = format_number(f.get<double>(c));
      break;
    case Kind::Bool:
      n = f.get<bool>(c);
      break;
    case Kind::String:
    case Kind::Choice:
      n = f.get<std::string>(c);
      break;
    case Kind::IntList:
      n = YAML::Node(YAML::NodeType::Sequence);
      for (int64_t v : f.get<std::vector<int64_t>>(c)) n.push_back(v);
      n.SetStyle(YAML::EmitterStyle::Flow);
      break;
  }
  return n;
}

std::string default_text(const Field& f) {
  static const Config defaults;
  switch (f.kind) {
    case Kind::Int:
      return std::to_string(f.get<int64_t>(defaults));
    case Kind::Float:
      return format_number(f.get<double>(defaults));
    case Kind::Bool:
      return f.get<bool>(defaults) ? "true" : "false";
    case Kind::String:
    case Kind::Choice: {
      const std::string& s = f.get<std::string>(defaults);
      return s.empty() ? "(derived)" : s;
    }
    case Kind::IntList: {
      std::vector<std::string> items;
      for (int64_t v : f.get<std::vector<int64_t>>(defaults)) items.push_back(std::to_string(v));
      std::string out = "[";  // appended piecewise: GCC 12's -Wrestrict misfires on "[" + s + "]"
      out += join(items);
      out += ']';
      return out;
    }
  }
  return "";
}

// ------------------------------------------------------------------------------------------------
// Loading.

// Counts the YAML documents in `yaml` without building them. yaml-cpp 0.7's LoadAll never returns on
// some malformed input (a document that starts with ','): the parser reports an empty document without
// consuming the offending token, again and again, and LoadAll keeps one node per report until memory
// runs out. A document that starts where the previous one did is therefore a syntax error at that mark.
class DocumentCounter : public YAML::EventHandler {
 public:
  static size_t count(const std::string& yaml) {
    std::istringstream in(yaml);
    YAML::Parser parser(in);
    DocumentCounter counter;
    size_t documents = 0;
    std::optional<int> previous_start;
    while (parser.HandleNextDocument(counter)) {
      if (previous_start == counter.start_.pos) {
        const std::string at = yaml.substr(std::min(static_cast<size_t>(counter.start_.pos), yaml.size()), 1);
        throw YAML::ParserException(counter.start_, fmt::format("'{}' cannot start a YAML node here", at));
      }
      previous_start = counter.start_.pos;
      ++documents;
    }
    return documents;
  }
  void OnDocumentStart(const YAML::Mark& mark) override { start_ = mark; }
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark&, YAML::anchor_t) override {}
  void OnAlias(const YAML::Mark&, YAML::anchor_t) override {}
  void OnScalar(const YAML::Mark&, const std::string&, YAML::anchor_t, const std::string&) override {}
  void OnSequenceStart(const YAML::Mark&, const std::string&, YAML::anchor_t, YAML::EmitterStyle::value) override {}
  void OnSequenceEnd() override {}
  void OnMapStart(const YAML::Mark&, const std::string&, YAML::anchor_t, YAML::EmitterStyle::value) override {}
  void OnMapEnd() override {}

 private:
  YAML::Mark start_;
};

struct Entry {
  YAML::Node node;
  std::string where;  // "file:line:col" or "override #k '...'"
  bool from_file = false;
};

class Loader {
 public:
  Loader(std::string name, const LoadOptions& options) : name_(std::move(name)), options_(options) {}

  Config load(const std::string& yaml, const std::vector<std::string>& overrides) {
    YAML::Node root;
    bool parsed = true;
    try {
      // Counted first: YAML::Load would silently ignore every document after the first.
      const size_t documents = DocumentCounter::count(yaml);
      if (documents > 1) {
        problems_.push_back(fmt::format("{}: holds {} YAML documents (separated by '---'); a config is one document",
                                        name_, documents));
        parsed = false;
      } else if (documents == 1) {
        root = YAML::Load(yaml);
      }
    } catch (const YAML::ParserException& e) {
      problems_.push_back(
          fmt::format("{}:{}:{}: malformed YAML: {}", name_, e.mark.line + 1, e.mark.column + 1, e.msg));
      parsed = false;
    }
    if (parsed) {
      if (root.IsMap()) {
        flatten(root, "");
      } else if (!root.IsNull()) {
        problems_.push_back(fmt::format("{}: expected a mapping of sections ({}) at the top level, got {}", name_,
                                        join(children_of("")), node_shape(root)));
      }
    }
    for (size_t k = 0; k < overrides.size(); ++k) apply_override(k + 1, overrides[k]);
    Config config;
    for (const Field& f : schema()) {
      auto it = entries_.find(f.path);
      if (it == entries_.end()) continue;
      if (auto p = assign(f, it->second.node, config)) {
        report(f.path, *p);
        invalid_.insert(f.path);
      }
    }
    config.source_file = name_;
    config.overrides = overrides;
    // Combinations and files are checked even when some keys were invalid, so one run reports every
    // problem; a combination is not reported against a key that already has its own problem.
    check_combinations(config);
    if (unknown_keys_ > kMaxUnknownKeysReported) {
      problems_.push_back(fmt::format("{}: {} more unknown keys (the first {} are listed above)", name_,
                                      unknown_keys_ - kMaxUnknownKeysReported, kMaxUnknownKeysReported));
    }
    if (!problems_.empty()) throw ConfigError(problems_);
    return config;
  }

 private:
  std::string mark(const YAML::Mark& m) const { return fmt::format("{}:{}:{}", name_, m.line + 1, m.column + 1); }
  std::string where(const std::string& path) const {
    auto it = entries_.find(path);
    return it == entries_.end() ? fmt::format("{} (default)", name_) : it->second.where;
  }
  bool is_set(const std::string& path) const {
    auto it = entries_.find(path);
    return it != entries_.end() && it->second.node.IsDefined() && !it->second.node.IsNull();
  }
  void report(const std::string& path, const std::string& message) {
    if (invalid_.count(path)) return;
    problems_.push_back(fmt::format("{}: {}: {}", where(path), path, message));
  }
  void report_at(const std::string& where, const std::string& path, const std::string& message) {
    problems_.push_back(fmt::format("{}: {}: {}", where, path, message));
  }
  // An unknown key's message searches the schema for a suggestion: a file of a million unknown keys must
  // still fail in moments, with a message a person can read, so only the first few are described and
  // the rest counted.
  static constexpr size_t kMaxUnknownKeysReported = 20;
  void report_unknown(const std::string& where, const std::string& path) {
    if (++unknown_keys_ <= kMaxUnknownKeysReported) report_at(where, path, unknown_key_message(path));
  }

  void flatten(const YAML::Node& map, const std::string& prefix) {
    std::map<std::string, std::string> seen;
    for (auto it = map.begin(); it != map.end(); ++it) {
      const YAML::Node key = it->first;
      const std::string at = mark(key.Mark());
      if (!key.IsScalar()) {
        report_at(at, prefix.empty() ? "(top level)" : prefix, "keys must be plain names");
        continue;
      }
      const std::string path = prefix.empty() ? key.Scalar() : prefix + "." + key.Scalar();
      if (auto dup = seen.find(key.Scalar()); dup != seen.end()) {
        report_at(at, path, fmt::format("duplicate key (first set at {})", dup->second));
        continue;
      }
      seen[key.Scalar()] = at;
      const YAML::Node value = it->second;
      if (is_section(path)) {
        if (value.IsMap()) {
          flatten(value, path);
        } else if (!value.IsNull()) {
          report_at(at, path,
                    fmt::format("is a section: expected a mapping of its keys ({}), got {}", join(children_of(path)),
                                node_shape(value)));
        }
      } else if (find_field(path)) {
        entries_[path] = {value, at, true};
      } else {
        report_unknown(at, path);
      }
    }
  }

  void apply_override(size_t k, const std::string& text) {
    const std::string at = fmt::format("override #{} '{}'", k, text);
    std::string body = text;
    enum class Mode { Set, Add, Force } mode = Mode::Set;
    if (body.rfind("++", 0) == 0) {
      mode = Mode::Force, body = body.substr(2);
    } else if (body.rfind("+", 0) == 0) {
      mode = Mode::Add, body = body.substr(1);
    }
    const auto eq = body.find('=');
    if (eq == std::string::npos) {
      problems_.push_back(fmt::format("{}: expected key.path=value", at));
      return;
    }
    const std::string key = body.substr(0, eq), raw = body.substr(eq + 1);
    if (key.empty() || key.front() == '.' || key.back() == '.' || key.find("..") != std::string::npos) {
      problems_.push_back(fmt::format("{}: '{}' is not a dotted key path", at, key));
      return;
    }
    std::string target = key;
    std::optional<size_t> index;
    const Field* field = find_field(key);
    if (!field) {
      const std::string leaf = leaf_of(key);
      const bool digits =
          !leaf.empty() && std::all_of(leaf.begin(), leaf.end(), [](char ch) { return ch >= '0' && ch <= '9'; });
      if (auto i = digits ? parse_int(leaf) : std::nullopt; i) {
        const Field* list = find_field(parent_of(key));
        if (list && list->kind == Kind::IntList) field = list, target = list->path, index = static_cast<size_t>(*i);
      }
    }
    if (!field) {
      if (is_section(key)) {
        report_at(at, key, fmt::format("is a section; set one of its keys: {}", join(children_of(key))));
      } else {
        report_unknown(at, key);
      }
      return;
    }
    if (mode == Mode::Add && is_set(target)) {
      report_at(at, key,
                fmt::format("'+' adds a key the config does not set, but {} sets it; use {}=... to override",
                            where(target), key));
      return;
    }
    YAML::Node value;
    if (field->kind == Kind::String || field->kind == Kind::Choice) {
      value = YAML::Node(raw);  // taken literally: paths may hold ':' or '#'
    } else {
      try {
        value = YAML::Load(raw);
      } catch (const YAML::Exception& e) {
        report_at(at, key, fmt::format("malformed value '{}': {}", raw, e.msg));
        return;
      }
    }
    if (index) {
      YAML::Node list;
      if (is_set(target) && entries_[target].node.IsSequence()) {
        list = YAML::Clone(entries_[target].node);
      } else {
        static const Config defaults;  // (a temporary Config here trips GCC 12's -Wmaybe-uninitialized)
        list = to_node(*field, defaults);
      }
      if (*index > list.size()) {
        report_at(at, key, fmt::format("index {} is past the end of the list ({} items)", *index, list.size()));
        return;
      }
      if (*index == list.size()) {
        list.push_back(value);
      } else {
        list[*index] = value;
      }
      // (YAML::Node assignment writes through references, so the list is stored as is rather than
      // assigned back into `value`, which it now contains.)
      entries_[target] = {list, at, false};
      return;
    }
    entries_[target] = {value, at, false};
  }

  // Resolves a relative input path: the current directory first, then the config file's directory
  // and its parent (so configs/x.yaml can name data/... from anywhere). Returns "" when not found.
  // A glob pattern (data.kind tokens: sharded files) counts as found where it matches a file.
  std::string find_input(const std::string& path) const {
    if (path.empty()) return "";
    auto found = [](const fs::path& p) {
      return fs::exists(p) || (data::is_glob_pattern(p.string()) && !data::glob_paths(p.string()).empty());
    };
    if (found(path)) return path;
    if (fs::path(path).is_absolute()) return "";
    const fs::path dir = fs::path(name_).parent_path();
    for (const fs::path& base : {dir, dir.parent_path()}) {
      if (base.empty()) continue;
      fs::path candidate = base / path;
      if (found(candidate)) return candidate.lexically_normal().string();
    }
    return "";
  }

  void require_file(std::string& value, const std::string& key, const std::string& what) {
    if (value.empty()) {
      report(key, fmt::format("required for {}: the path of {}", what,
                              key == "data.labels_path" ? "the labels idx file" : "the input file"));
      return;
    }
    if (!options_.check_files) return;
    std::string found = find_input(value);
    if (found.empty()) {
      const std::string what = data::is_glob_pattern(value) ? fmt::format("no file matches the pattern '{}'", value)
                                                            : fmt::format("file '{}' does not exist", value);
      report(key, fmt::format("{} (looked in the current directory and beside the config)", what));
    } else {
      value = found;
    }
  }

  // training.cuda_graph replays one captured micro-batch: what a replay cannot redo is refused.
  void check_cuda_graph(const Config& c) {
    if (c.training.device == "cpu") report("training.cuda_graph", "needs a GPU, but training.device is cpu");
    if (c.training.grad_accum > 1) {
      report("training.cuda_graph", fmt::format("captures one micro-batch a step: needs training.grad_accum 1, got {}",
                                                c.training.grad_accum));
    }
    if (c.training.precision == "fp16") {
      report("training.cuda_graph", "cannot hold fp16's loss scale (it changes between steps): use bf16 or fp32");
    }
  }

  // strategy zero shards buckets, which are reduce-scattered by NCCL or Gloo in the gradients' dtype.
  void check_zero(const Config& c) {
    if (c.training.precision == "fp16") {
      report("distributed.strategy", "zero needs bf16 or fp32: fp16's loss scaling is not sharded");
    }
    if (c.distributed.comm_dtype != "fp32") {
      report("distributed.strategy",
             fmt::format("zero communicates in the gradients' dtype: needs distributed.comm_dtype fp32, got {}",
                         c.distributed.comm_dtype));
    }
  }

  // strategy gathered_grads forms weight gradients from every rank's layer inputs: Linear layers only, one
  // micro-batch per step, in the compute dtype.
  void check_gathered(const Config& c) {
    if (c.model.kind != "mlp") {
      report("distributed.strategy",
             fmt::format("gathered_grads shards Linear layers only: needs model.kind mlp, got {}", c.model.kind));
    }
    if (c.training.precision == "fp16") {
      report("distributed.strategy", "gathered_grads needs bf16 or fp32: fp16's loss scaling is not sharded");
    }
    if (c.training.grad_accum > 1) {
      report("distributed.strategy",
             fmt::format("gathered_grads gathers each micro-batch's inputs for its own update: needs "
                         "training.grad_accum 1, got {}",
                         c.training.grad_accum));
    }
    if (c.distributed.comm_dtype != "fp32") {
      report("distributed.strategy",
             fmt::format("gathered_grads gathers inputs in the compute dtype: needs distributed.comm_dtype fp32, got {}",
                         c.distributed.comm_dtype));
    }
  }

  void check_combinations(Config& c) {
    // Steps or epochs.
    if (c.training.epochs > 0) {
      if (is_set("training.steps") && c.training.steps > 0) {
        report("training.epochs",
               fmt::format("set either training.steps ({}) or training.epochs, not both (steps at {})",
                           c.training.steps, where("training.steps")));
      } else {
        c.training.steps = 0;
      }
    } else if (c.training.steps == 0) {
      report("training.steps", "one of training.steps or training.epochs must be > 0");
    }
    // Device.
    const std::string& dev = c.training.device;
    const bool cuda = dev == "cuda" || dev.rfind("cuda:", 0) == 0;
    if (dev != "auto" && dev != "cpu" && !cuda) {
      report("training.device", fmt::format("expected auto | cpu | cuda | cuda:N, got '{}'", dev));
    } else if (dev.rfind("cuda:", 0) == 0 && !parse_int(dev.substr(5)).has_value()) {
      report("training.device", fmt::format("expected cuda:N with N a device index, got '{}'", dev));
    } else if (cuda && options_.check_device && !cuda::is_available()) {
      report("training.device", fmt::format("'{}' requested but no CUDA device is available (use auto or cpu)", dev));
    }
    if (c.training.cuda_graph == "true") check_cuda_graph(c);
    if (c.distributed.strategy == "zero") check_zero(c);
    if (c.distributed.strategy == "gathered_grads") check_gathered(c);
    if (c.distributed.copy_engines == "true" && c.distributed.strategy != "zero" &&
        c.distributed.strategy != "gathered_grads") {
      report("distributed.copy_engines",
             "true moves the collectives of a sharded optimizer: needs distributed.strategy zero or gathered_grads");
    }
    if (c.distributed.copy_engines == "true" && dev == "cpu") {
      report("distributed.copy_engines", "moves bytes between GPUs but training.device is cpu");
    }
    if (c.distributed.backend == "nccl" && dev == "cpu") {
      report("distributed.backend", "nccl needs GPUs but training.device is cpu; use gloo or auto");
    }
    // Model and data agree.
    const std::string& m = c.model.kind;
    const std::string& d = c.data.kind;
    const std::string form = registered_data_form(d);
    const bool token_data = form == "tokens";
    const bool image_data = form == "images";
    if (m == "gpt" && !token_data) {
      report("data.kind", fmt::format("model.kind gpt needs token data (tokens | text | synthetic_tokens), got {}", d));
    } else if (m == "cnn" && !image_data) {
      report("data.kind", fmt::format("model.kind cnn needs image data (mnist | synthetic_images), got {}", d));
    } else if (m == "mlp" && token_data) {
      report("data.kind", fmt::format("model.kind mlp needs feature data (synthetic_classification | "
                                      "synthetic_regression | synthetic_images | mnist), got {}",
                                      d));
    }
    if (m == "gpt") {
      const GptConfig& g = c.model.gpt;
      if (g.n_embd % g.n_head != 0) {
        report("model.gpt.n_embd",
               fmt::format("must be divisible by model.gpt.n_head ({}), got {}", g.n_head, g.n_embd));
      }
      if (g.block_size > 0 && g.block_size < c.data.seq_len) {
        report("model.gpt.block_size",
               fmt::format("must be >= data.seq_len ({}), got {}", c.data.seq_len, g.block_size));
      }
      if (d == "synthetic_tokens" && g.vocab_size > 0 && g.vocab_size < c.data.vocab_size) {
        report("model.gpt.vocab_size",
               fmt::format("must be >= data.vocab_size ({}), got {}", c.data.vocab_size, g.vocab_size));
      }
      if (d == "synthetic_tokens" && c.data.num_tokens < c.data.seq_len + 1) {
        report("data.num_tokens",
               fmt::format("must be > data.seq_len ({}), got {}", c.data.seq_len, c.data.num_tokens));
      }
    }
    if (!c.model.init_from.empty()) {
      if (m != "gpt") {
        report("model.init_from", fmt::format("loads GPT-2 weights, but model.kind is {}", m));
      } else {
        require_file(c.model.init_from, "model.init_from", "model.init_from");
      }
    }
    if (m == "cnn" && c.model.cnn.kernel_size % 2 == 0) {
      report("model.cnn.kernel_size", fmt::format("must be odd (same padding), got {}", c.model.cnn.kernel_size));
    }
    if (d == "synthetic_classification" && c.data.pattern == "spirals" && c.data.num_features != 2) {
      report("data.num_features",
             fmt::format("data.pattern spirals lives in the plane: needs 2, got {}", c.data.num_features));
    }
    if (d.rfind("synthetic_", 0) == 0 && d != "synthetic_tokens" && c.training.batch_size > c.data.num_samples) {
      report("training.batch_size", fmt::format("{} is larger than the dataset (data.num_samples {})",
                                                c.training.batch_size, c.data.num_samples));
    }
    // Files.
    if (d == "tokens") require_file(c.data.path, "data.path", "data.kind tokens");
    if (d == "text") require_file(c.data.path, "data.path", "data.kind text");
    if (d == "mnist") {
      require_file(c.data.path, "data.path", "data.kind mnist");
      require_file(c.data.labels_path, "data.labels_path", "data.kind mnist");
      if (!c.data.val_path.empty() || !c.data.val_labels_path.empty()) {
        require_file(c.data.val_path, "data.val_path", "mnist validation");
        require_file(c.data.val_labels_path, "data.val_labels_path", "mnist validation");
      }
    }
    if (d == "tokens" && !c.data.val_path.empty()) require_file(c.data.val_path, "data.val_path", "tokens validation");
    const std::string& resume = c.checkpoint.resume;
    if (resume.empty()) {
      report("checkpoint.resume", "expected auto | never | the path of a checkpoint, got ''");
    } else if (resume != "auto" && resume != "never" && options_.check_files) {
      std::string found = find_input(resume);
      if (found.empty()) {
        report("checkpoint.resume", fmt::format("expected auto | never | the path of an existing checkpoint; '{}' does "
                                                "not exist",
                                                resume));
      } else {
        c.checkpoint.resume = found;
      }
    }
    // Schedule.
    if (c.schedule.kind == "cosine" && c.training.steps > 0 && c.schedule.warmup_steps >= c.training.steps) {
      report("schedule.warmup_steps",
             fmt::format("must be below training.steps ({}), got {}", c.training.steps, c.schedule.warmup_steps));
    }
    if (c.schedule.kind == "cosine" && c.schedule.min_lr > c.optim.lr) {
      report("schedule.min_lr", fmt::format("must not exceed optim.lr ({}), got {}", format_number(c.optim.lr),
                                            format_number(c.schedule.min_lr)));
    }
    // Derived values.
    if (c.checkpoint.dir.empty()) {
      const std::string stem = fs::path(name_).stem().string();
      c.checkpoint.dir = "runs/" + (stem.empty() || stem.front() == '<' ? std::string("default") : stem);
    }
    if (c.logging.metrics_file.empty())
      c.logging.metrics_file = (fs::path(c.checkpoint.dir) / "metrics.jsonl").string();
    if (d == "synthetic_tokens" && c.data.path.empty()) {
      c.data.path =
          (fs::path(c.checkpoint.dir) / "data" /
           fmt::format("synthetic_tokens_v{}_n{}_s{}.bin", c.data.vocab_size, c.data.num_tokens, c.training.seed))
              .string();
    }
  }

  std::string name_;
  LoadOptions options_;
  std::map<std::string, Entry> entries_;
  std::vector<std::string> problems_;
  size_t unknown_keys_ = 0;
  std::set<std::string> invalid_;  // keys whose own value was rejected
};

std::string read_file(const std::string& path) {
  if (!fs::is_regular_file(path)) {
    throw ConfigError({fmt::format("{}: config file does not exist or is not a regular file", path)});
  }
  std::ifstream in(path, std::ios::binary);
  if (!in.good()) throw ConfigError({fmt::format("{}: cannot read the config file", path)});
  std::ostringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

std::string format_problems(const std::vector<std::string>& problems) {
  std::string out = fmt::format("invalid config ({} problem{}):", problems.size(), problems.size() == 1 ? "" : "s");
  for (const auto& p : problems) out += "\n  " + p;
  return out;
}

}  // namespace

// ------------------------------------------------------------------------------------------------

ConfigError::ConfigError(std::vector<std::string> problems)
    : Error(format_problems(problems)), problems_(std::move(problems)) {}

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

Config load_config_text(const std::string& yaml, const std::string& name, const std::vector<std::string>& overrides,
                        const LoadOptions& options) {
  return Loader(name, options).load(yaml, overrides);
}

Config load_config(const std::string& path, const std::vector<std::string>& overrides, const LoadOptions& options) {
  return load_config_text(read_file(path), path, overrides, options);
}

namespace {

// `text` inside a comment line: a line break in it (an override's value, a file name) continues the comment
// instead of ending it, or the rest would be read back as keys.
std::string comment_text(const std::string& text) {
  std::string out;
  for (char c : text) out += (c == '\n' || c == '\r') ? std::string("\n#     ") : std::string(1, c);
  return out;
}

}  // namespace

std::string to_yaml(const Config& config) {
  YAML::Node root(YAML::NodeType::Map);
  for (const Field& f : schema()) {
    // Walk/create the sections of the dotted path, then set the leaf.
    std::vector<std::string> parts;
    std::stringstream ss(f.path);
    for (std::string part; std::getline(ss, part, '.');) parts.push_back(part);
    std::vector<YAML::Node> chain{root};
    for (size_t i = 0; i + 1 < parts.size(); ++i) {
      YAML::Node next = chain.back()[parts[i]];
      if (!next.IsMap()) {
        next = YAML::Node(YAML::NodeType::Map);
        chain.back()[parts[i]] = next;
      }
      chain.push_back(chain.back()[parts[i]]);
    }
    chain.back()[parts.back()] = to_node(f, config);
  }
  YAML::Emitter out;
  out << root;
  std::string header = "# Resolved dptrain config";
  if (!config.source_file.empty()) header += " from " + comment_text(config.source_file);
  for (const auto& o : config.overrides) header += "\n#   --set " + comment_text(o);
  return header + "\n" + out.c_str() + "\n";
}

void write_config(const Config& config, const std::string& path) {
  const fs::path target(path);
  if (target.has_parent_path()) fs::create_directories(target.parent_path());
  const std::string tmp = fmt::format("{}.tmp.{}", path, ::getpid());
  {
    std::ofstream out(tmp, std::ios::trunc);
    DPT_CHECK(out.good(), "write_config: cannot create '{}'", tmp);
    out << to_yaml(config);
    out.flush();
    if (!out.good()) {
      fs::remove(tmp);
      DPT_FAIL("write_config: writing '{}' failed (disk full?)", tmp);
    }
  }
  fs::rename(tmp, target);
}

std::string config_reference() {
  // A '|' inside a cell would end it: Markdown tables want it escaped.
  auto cell = [](const std::string& text) {
    std::string out;
    for (char ch : text) out += ch == '|' ? std::string("\\|") : std::string(1, ch);
    return out;
  };
  std::string out = "| key | type | default | allowed | meaning |\n| --- | --- | --- | --- | --- |\n";
  for (const Field& f : schema()) {
    out += fmt::format("| `{}` | {} | `{}` | {} | {} |\n", f.path, kind_name(f.kind), cell(default_text(f)),
                       cell(allowed_text(f)), cell(f.spec.help));
  }
  // What each registered name stands for, from its registry entry: a component added to a registry is
  // described here without a word changed in this file. By name, as self-registration follows link order.
  out += "\n## Registered components\n\n| key | name | what it is |\n| --- | --- | --- |\n";
  for (const Field& f : schema()) {
    if (f.kind != Kind::Choice) continue;
    std::vector<RegisteredComponent> components = registered_components(f.path);
    std::sort(components.begin(), components.end(), [](const auto& a, const auto& b) { return a.name < b.name; });
    for (const RegisteredComponent& c : components)
      out += fmt::format("| `{}` | `{}` | {} |\n", f.path, c.name, cell(c.help));
  }
  return out;
}

std::vector<std::string> config_keys() {
  std::vector<std::string> keys;
  for (const Field& f : schema()) keys.push_back(f.path);
  return keys;
}

std::vector<std::pair<std::string, std::string>> config_values(const Config& config) {
  std::vector<std::pair<std::string, std::string>> values;
  for (const Field& f : schema()) {
    YAML::Emitter out;
    out << to_node(f, config);
    values.emplace_back(f.path, out.c_str());
  }
  return values;
}

}  // namespace dpt::train
