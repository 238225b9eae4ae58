#include "memory_estimate.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>

#include "components.h"
#include "core/cuda_runtime.h"
#include "core/error.h"
#include "core/flags.h"

namespace dpt::train {

namespace {

// What the model's registry entry estimates (apps/train/models/); a model without an estimate is not
// counted before it exists: nothing to refuse it on.
ModelFootprint model_footprint(const Config& config, const DataShape& shape, DType compute, const Device& device) {
  const std::string& kind = config.model.kind;
  const auto* entry = models().find(kind);
  if (entry && entry->make.estimate) {
    return entry->make.estimate(config, Settings(config, "model." + kind, entry->settings), shape, compute, device);
  }
  ModelFootprint unknown;
  unknown.keys = fmt::format("model.kind {} (not estimated)", kind);
  return unknown;
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
  const ModelFootprint model = model_footprint(config, shape, compute, device);
  if (keys) *keys = model.keys;
  const double p = model.parameters;
  const bool mixed = compute != DType::Float32;
  const std::string& optim = config.optim.kind;
  MemoryEstimate e;
  e.parameters = static_cast<int64_t>(std::min(p, 9.2e18));
  e.weights = p * c;
  e.masters = mixed ? p * 4 : 0;
  // bf16 on a GPU updates straight from the bf16 gradients (Trainer::setup_optimizer): no float32 copies.
  const bool master_gradients = mixed && !(compute == DType::BFloat16 && device.is_cuda());
  e.gradients = p * c + (master_gradients ? p * 4 : 0);
  e.optimizer = optim == "sgd" ? (config.optim.momentum != 0 ? p * 4 : 0) : p * 8;
  e.buckets = world_size > 1 ? p * c : 0;
  e.activations = model.activations;
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
