#include "memory_estimate.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>

#include "core/cuda_runtime.h"
#include "core/error.h"
#include "core/flags.h"
#include "core/ops_flash_attention.h"
#include "layers/swiglu.h"

namespace dpt::train {

namespace {

// Counts in double: the configs this check exists for overflow int64 in bytes (65536^2 x 12 x 1024 x 16).
struct Counts {
  double parameters = 0;
  double activations = 0;  // bytes, one micro-batch
  std::string keys;        // the config keys that set the size, with their values
};

// GPT-2 (layers/gpt.h): wte V x C, wpe T x C, per block two LayerNorms (2C each), qkv (3C^2 + 3C),
// proj (C^2 + C), fc (4C^2 + 4C), fc proj (4C^2 + C), then ln_f (2C); the head is tied to wte.
// Activations kept per token and layer: the block's inputs and outputs of LayerNorms, qkv, attention,
// projections and the MLP's 4C-wide hidden (about 18 C values); without fused attention (the CPU, a
// composed case on the GPU, or attention dropout) also the [T x T] scores, softmax and dropout of every head (3 H T
// values). Then the logits (compute dtype) with float32 log-softmax and its gradient (8 bytes each), and one more layer
// of gradients while backward runs through it.
Counts gpt_counts(const Config& config, const DataShape& shape, double c, bool fused_attention) {
  const GptConfig& g = config.model.gpt;
  const double v = static_cast<double>(g.vocab_size > 0 ? g.vocab_size : shape.vocab_size);
  const double block = static_cast<double>(g.block_size > 0 ? g.block_size : shape.seq_len);
  const double ch = static_cast<double>(g.n_embd), layers = static_cast<double>(g.n_layer);
  const double heads = static_cast<double>(g.n_head), t = static_cast<double>(shape.seq_len);
  const double b = static_cast<double>(config.training.batch_size);
  Counts out;
  // The feed-forward: fc and proj (8C^2 + 5C), or SwiGLU's gate, up and proj around H = SwiGLU::hidden_width.
  const double hidden = static_cast<double>(nn::SwiGLU::hidden_width(g.n_embd));
  const double ffn = g.ffn == "swiglu" ? 3 * ch * hidden + 2 * hidden + ch : 8 * ch * ch + 5 * ch;
  out.parameters = v * ch + block * ch + layers * (4 * ch * ch + 8 * ch + ffn) + 2 * ch;
  const double scores = fused_attention && g.dropout == 0 ? 0 : 3 * heads * t;
  const double per_layer = (18 * ch + scores) * c;
  out.activations = b * t * ((layers + 1) * per_layer + ch * c + v * (c + 8));
  out.keys = fmt::format(
      "model.gpt.n_layer {}, model.gpt.n_embd {}, model.gpt.n_head {}, vocabulary {}, "
      "training.batch_size {}, data.seq_len {}",
      g.n_layer, g.n_embd, g.n_head, v, config.training.batch_size, shape.seq_len);
  return out;
}

// An MLP's Linear layers; per example it keeps each hidden layer's pre-activation and activation, the
// input, and the output with float32 softmax and gradient; backward's gradients double it.
Counts mlp_counts(const Config& config, const DataShape& shape, double c) {
  std::vector<double> sizes{static_cast<double>(shape.num_features)};
  for (int64_t h : config.model.mlp.hidden) sizes.push_back(static_cast<double>(h));
  sizes.push_back(static_cast<double>(shape.num_outputs));
  Counts out;
  double per_example = sizes.front() * c + sizes.back() * (c + 8);
  for (size_t i = 1; i < sizes.size(); ++i) {
    out.parameters += sizes[i - 1] * sizes[i] + sizes[i];
    if (i + 1 < sizes.size()) per_example += 2 * sizes[i] * c;
  }
  out.activations = 2 * static_cast<double>(config.training.batch_size) * per_example;
  out.keys = fmt::format("model.mlp.hidden [{}], input width {}, training.batch_size {}",
                         fmt::join(config.model.mlp.hidden, ", "), shape.num_features, config.training.batch_size);
  return out;
}

// apps/train/model_factory.cpp's CNN: per stage a k x k conv (same padding), ReLU and 2x2 max-pool, then
// Linear(hidden), ReLU, Linear(classes). Per example each stage keeps the conv and ReLU outputs and the
// pooled map (2.25 x channels x height x width); backward's gradients double it.
Counts cnn_counts(const Config& config, const DataShape& shape, double c) {
  const CnnConfig& cnn = config.model.cnn;
  const double k2 = static_cast<double>(cnn.kernel_size * cnn.kernel_size);
  double in = static_cast<double>(shape.channels), area = static_cast<double>(shape.height * shape.width);
  Counts out;
  double per_example = in * area * c;
  for (int64_t ch : cnn.channels) {
    const double o = static_cast<double>(ch);
    out.parameters += k2 * in * o + o;
    per_example += 2.25 * o * area * c;
    in = o;
    area /= 4;
  }
  const double flat = in * area, hidden = static_cast<double>(cnn.hidden);
  const double classes = static_cast<double>(shape.num_outputs);
  out.parameters += flat * hidden + hidden + hidden * classes + classes;
  per_example += 2 * hidden * c + classes * (c + 8);
  out.activations = 2 * static_cast<double>(config.training.batch_size) * per_example;
  out.keys = fmt::format("model.cnn.channels [{}], model.cnn.hidden {}, images {}x{}x{}, training.batch_size {}",
                         fmt::join(cnn.channels, ", "), cnn.hidden, shape.channels, shape.height, shape.width,
                         config.training.batch_size);
  return out;
}

Counts model_counts(const Config& config, const DataShape& shape, double c, bool fused_attention) {
  const std::string& kind = config.model.kind;
  if (kind == "gpt") return gpt_counts(config, shape, c, fused_attention);
  if (kind == "mlp") return mlp_counts(config, shape, c);
  if (kind == "cnn") return cnn_counts(config, shape, c);
  // A registered model (apps/train/models/) is not counted before it exists: nothing to refuse it on.
  Counts registered;
  registered.keys = fmt::format("model.kind {} (not estimated)", kind);
  return registered;
}

// The first number after `key` in /proc/meminfo-style text ("MemAvailable:   123456 kB"), or -1.
double meminfo_kib(const std::string& key) {
  std::ifstream in("/proc/meminfo");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(key + ":", 0) != 0) continue;
    std::istringstream fields(line.substr(key.size() + 1));
    double kib = -1;
    fields >> kib;
    return kib;
  }
  return -1;
}

double read_number(const std::string& path) {
  std::ifstream in(path);
  double v = -1;
  if (!(in >> v)) return -1;  // absent, or "max" (no limit)
  return v;
}

// What this process's memory cgroup still allows (limit - usage), or -1 when it sets no limit. cgroup
// v2 first (the path from /proc/self/cgroup's "0::<path>" line), then v1's memory controller.
double cgroup_room() {
  std::string path;
  std::ifstream in("/proc/self/cgroup");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("0::", 0) == 0) path = line.substr(3);
  for (const std::string& dir : {"/sys/fs/cgroup" + path, std::string("/sys/fs/cgroup")}) {
    const double limit = read_number(dir + "/memory.max"), used = read_number(dir + "/memory.current");
    if (limit >= 0 && used >= 0) return std::max(0.0, limit - used);
  }
  const double limit = read_number("/sys/fs/cgroup/memory/memory.limit_in_bytes");
  const double used = read_number("/sys/fs/cgroup/memory/memory.usage_in_bytes");
  // v1 reports "no limit" as a huge number (the page-rounded int64 maximum).
  if (limit >= 0 && used >= 0 && limit < 1e18) return std::max(0.0, limit - used);
  return -1;
}

}  // namespace

std::string human_bytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  int u = 0;
  while (bytes >= 1024 && u < 6) bytes /= 1024, ++u;
  return fmt::format("{:.1f} {}", bytes, units[u]);
}

MemoryEstimate estimate_training_memory(const Config& config, const DataShape& shape, DType compute,
                                        const Device& device, int world_size, std::string* keys) {
  const double c = static_cast<double>(dtype_size(compute));
  // On a GPU, bfloat16 attention with a head size the fused kernels take runs fused
  // (core/ops_flash_attention.h): no [T x T] scores kept. Other dtypes and head sizes, and
  // DPT_ATTENTION=reference, compose the op and keep them.
  const GptConfig& g = config.model.gpt;
  const bool fused_attention = device.is_cuda() && g.n_head > 0 && g.n_embd % g.n_head == 0 &&
                               fused_causal_attention_supported(compute, g.n_embd / g.n_head) &&
                               flag_value(Flag::Attention) != "reference";
  const Counts counts = model_counts(config, shape, c, fused_attention);
  if (keys) *keys = counts.keys;
  const double p = counts.parameters;
  const bool mixed = compute != DType::Float32;
  const std::string& optim = config.optim.kind;
  MemoryEstimate e;
  e.parameters = static_cast<int64_t>(std::min(p, 9.2e18));
  e.weights = p * c;
  e.masters = mixed ? p * 4 : 0;
  e.gradients = p * c + (mixed ? p * 4 : 0);
  e.optimizer = optim == "sgd" ? (config.optim.momentum != 0 ? p * 4 : 0) : p * 8;
  e.buckets = world_size > 1 ? p * c : 0;
  e.activations = counts.activations;
  return e;
}

double available_memory(const Device& device, int local_processes, std::string* where) {
  if (device.is_cuda()) {
    const auto free = static_cast<double>(cuda::free_memory(device.index));
    if (where) {
      *where = fmt::format("{} ({}) has {} free of {}", device.str(), cuda::device_name(device.index),
                           human_bytes(free), human_bytes(static_cast<double>(cuda::total_memory(device.index))));
    }
    return free;
  }
  const double available = meminfo_kib("MemAvailable") * 1024;
  const double room = cgroup_room();
  double bytes = available >= 0 ? available : 0;
  std::string source = fmt::format("MemAvailable {}", human_bytes(bytes));
  if (room >= 0 && (available < 0 || room < available)) {
    bytes = room;
    source = fmt::format("the memory cgroup's remaining limit {}", human_bytes(room));
  }
  const double share = bytes / std::max(1, local_processes);
  if (where) {
    *where = local_processes > 1 ? fmt::format("this host has {} for {} processes ({} each)", source, local_processes,
                                               human_bytes(share))
                                 : fmt::format("this host has {}", source);
  }
  return share;
}

void check_memory_fits(const Config& config, const DataShape& shape, DType compute, const Device& device,
                       int local_processes, int world_size) {
  if (!flag_on(Flag::MemoryCheck)) return;
  std::string keys, where;
  const MemoryEstimate e = estimate_training_memory(config, shape, compute, device, world_size, &keys);
  const double available = available_memory(device, local_processes, &where);
  spdlog::debug("memory: about {} needed ({} parameters); {}", human_bytes(e.total()), e.parameters, where);
  if (e.total() <= available) return;
  std::string parts = fmt::format("weights {} ({}), ", human_bytes(e.weights), dtype_name(compute));
  if (e.masters > 0) parts += fmt::format("float32 masters {}, ", human_bytes(e.masters));
  parts += fmt::format("gradients {}, optimizer state {} ({}), ", human_bytes(e.gradients), human_bytes(e.optimizer),
                       config.optim.kind);
  if (e.buckets > 0) parts += fmt::format("gradient buckets {}, ", human_bytes(e.buckets));
  parts += fmt::format("activations {}", human_bytes(e.activations));
  DPT_FAIL(
      "the model does not fit: training it needs about {} ({:.4g} parameters: {}), but {}. It is sized by {}; "
      "make the model or the batch smaller (or training.precision bf16 on a GPU). Nothing was allocated. "
      "(DPT_MEMORY_CHECK=0 skips this estimate)",
      human_bytes(e.total()), static_cast<double>(e.parameters), parts, where, keys);
}

}  // namespace dpt::train
