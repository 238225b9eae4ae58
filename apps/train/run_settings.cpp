#include "run_settings.h"

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <sstream>

#include "core/error.h"

namespace dpt::train {

namespace {

constexpr const char* kSettingsKey = "train.settings";
constexpr const char* kHashKey = "train.settings_hash";

// The data keys that define which examples a run sees and in what order (not data.prefetch, which only
// overlaps loading with compute).
bool defines_data(const std::string& key) {
  static const char* const kKeys[] = {
      "data.kind",           "data.path",        "data.val_path",   "data.labels_path", "data.val_labels_path",
      "data.val_fraction",   "data.seq_len",     "data.window",     "data.num_samples", "data.num_features",
      "data.num_classes",    "data.num_outputs", "data.pattern",    "data.noise",       "data.image_size",
      "data.image_channels", "data.vocab_size",  "data.num_tokens", "data.shuffle"};
  return std::find(std::begin(kKeys), std::end(kKeys), key) != std::end(kKeys);
}

bool is_computation_key(const std::string& key) {
  static const char* const kTraining[] = {"training.precision", "training.batch_size", "training.grad_accum",
                                          "training.seed", "training.grad_clip"};
  auto starts = [&](const char* prefix) { return key.rfind(prefix, 0) == 0; };
  return starts("model.") || starts("optim.") || starts("schedule.") || defines_data(key) ||
         std::find(std::begin(kTraining), std::end(kTraining), key) != std::end(kTraining);
}

std::string as_lines(const RunSettings& settings) {
  std::string out;
  for (const auto& [key, value] : settings) out += key + "=" + value + "\n";
  return out;
}

// Values are one line of YAML, so a line splits at its first '=' (keys hold none).
RunSettings parse_lines(const std::string& text) {
  RunSettings out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    const auto eq = line.find('=');
    if (eq == std::string::npos) continue;
    out.emplace_back(line.substr(0, eq), line.substr(eq + 1));
  }
  return out;
}

}  // namespace

RunSettings computation_settings(const Config& config, int world_size) {
  // Input paths as absolute ones: the same file reached from another working directory (or through the
  // config's directory) is the same data.
  Config resolved = config;
  for (std::string* path : {&resolved.data.path, &resolved.data.val_path, &resolved.data.labels_path,
                            &resolved.data.val_labels_path, &resolved.model.init_from}) {
    std::error_code ec;
    if (!path->empty()) *path = std::filesystem::weakly_canonical(std::filesystem::absolute(*path), ec).string();
  }
  RunSettings out;
  for (auto& [key, value] : config_values(resolved))
    if (is_computation_key(key)) out.emplace_back(std::move(key), std::move(value));
  out.emplace_back("world_size", std::to_string(world_size));
  return out;
}

std::string settings_hash(const RunSettings& settings) {
  uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a offset basis and prime (64-bit)
  for (unsigned char c : as_lines(settings)) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return fmt::format("{:016x}", h);
}

void record_settings(const RunSettings& settings, SafetensorsMetadata& extra) {
  extra[kSettingsKey] = as_lines(settings);
  extra[kHashKey] = settings_hash(settings);
}

std::optional<std::vector<std::string>> settings_changes(const SafetensorsMetadata& extra, const RunSettings& current) {
  auto hash = extra.find(kHashKey);
  auto lines = extra.find(kSettingsKey);
  if (hash == extra.end() || lines == extra.end()) return std::nullopt;
  std::vector<std::string> changes;
  if (hash->second == settings_hash(current)) return changes;
  const RunSettings saved = parse_lines(lines->second);
  std::map<std::string, std::string> old_values(saved.begin(), saved.end());
  for (const auto& [key, value] : current) {
    auto it = old_values.find(key);
    const std::string before = it == old_values.end() ? "(absent)" : it->second;
    if (before != value) changes.push_back(fmt::format("{}: {} -> {}", key, before, value));
    if (it != old_values.end()) old_values.erase(it);
  }
  for (const auto& [key, value] : saved)
    if (old_values.count(key)) changes.push_back(fmt::format("{}: {} -> (absent)", key, value));
  // Equal lines under another hash: the recorded hash itself was changed.
  if (changes.empty()) changes.push_back(fmt::format("{}: {} -> {}", kHashKey, hash->second, settings_hash(current)));
  return changes;
}

}  // namespace dpt::train
