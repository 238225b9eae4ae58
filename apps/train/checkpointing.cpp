#include "checkpointing.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <filesystem>
#include <regex>

#include "core/error.h"
#include "core/shape.h"

namespace dpt::train {

namespace fs = std::filesystem;

namespace {

constexpr const char* kPrefixName = "checkpoint";

void fsync_dir(const fs::path& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

std::string shape_text(const Tensor& t) { return shape_str(t.shape()); }

}  // namespace

std::string checkpoint_path(const std::string& dir, int64_t step) {
  return (fs::path(dir) / fmt::format("step_{:08d}", step)).string();
}

std::vector<CheckpointEntry> list_checkpoints(const std::string& dir) {
  std::vector<CheckpointEntry> out;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return out;
  static const std::regex pattern("step_([0-9]+)");
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    std::smatch m;
    const std::string name = e.path().filename().string();
    if (!e.is_directory() || !std::regex_match(name, m, pattern)) continue;
    out.push_back({std::stoll(m[1].str()), e.path().string()});
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.step < b.step; });
  return out;
}

std::string save_run_checkpoint(const std::string& dir, const NamedTensors& model_state,
                                const NamedTensors& optimizer_state, const optim::TrainingState& state, int64_t keep) {
  fs::create_directories(dir);
  const fs::path final_path = checkpoint_path(dir, state.step);
  const fs::path tmp = final_path.string() + fmt::format(".tmp-{}", ::getpid());
  fs::remove_all(tmp);
  fs::create_directories(tmp);
  try {
    optim::save_checkpoint((tmp / kPrefixName).string(), model_state, optimizer_state, state);
  } catch (...) {
    std::error_code ec;
    fs::remove_all(tmp, ec);
    throw;
  }
  // Swap into place: an existing checkpoint of the same step (an earlier run's) goes only once the new
  // one is complete.
  if (fs::exists(final_path)) {
    const fs::path old = final_path.string() + fmt::format(".old-{}", ::getpid());
    fs::rename(final_path, old);
    fs::rename(tmp, final_path);
    fs::remove_all(old);
  } else {
    fs::rename(tmp, final_path);
  }
  fsync_dir(dir);
  // Retention: nothing newer than this step survives (it belongs to an abandoned run), then keep K.
  std::vector<CheckpointEntry> all = list_checkpoints(dir);
  std::vector<CheckpointEntry> kept;
  for (const auto& e : all) {
    if (e.step > state.step) {
      fs::remove_all(e.path);
    } else {
      kept.push_back(e);
    }
  }
  for (size_t i = 0; i + static_cast<size_t>(keep) < kept.size(); ++i) fs::remove_all(kept[i].path);
  return final_path.string();
}

optim::Checkpoint load_run_checkpoint(const std::string& path) {
  fs::path p(path);
  std::string prefix;
  if (fs::is_directory(p)) {
    prefix = (p / kPrefixName).string();
  } else {
    std::string s = p.string();
    for (const char* suffix : {".model.safetensors", ".optim.safetensors"}) {
      const std::string suf(suffix);
      if (s.size() > suf.size() && s.compare(s.size() - suf.size(), suf.size(), suf) == 0) {
        s = s.substr(0, s.size() - suf.size());
        break;
      }
    }
    prefix = s;
  }
  DPT_CHECK(fs::exists(prefix + ".model.safetensors") && fs::exists(prefix + ".optim.safetensors"),
            "checkpoint '{}': expected {}.model.safetensors and {}.optim.safetensors", path, prefix, prefix);
  return optim::load_checkpoint(prefix);
}

std::optional<FoundCheckpoint> find_newest_valid(const std::string& dir, std::vector<std::string>* skipped) {
  std::vector<CheckpointEntry> all = list_checkpoints(dir);
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    try {
      return FoundCheckpoint{*it, load_run_checkpoint(it->path)};
    } catch (const std::exception& e) {
      if (skipped) skipped->push_back(fmt::format("{}: {}", it->path, e.what()));
    }
  }
  return std::nullopt;
}

int64_t extra_int(const optim::Checkpoint& checkpoint, const std::string& key) {
  auto it = checkpoint.state.extra.find(key);
  DPT_CHECK(it != checkpoint.state.extra.end(), "checkpoint metadata has no '{}' (not written by dpt-train?)", key);
  int64_t value = 0;
  const std::string& s = it->second;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
  DPT_CHECK(ec == std::errc() && end == s.data() + s.size(), "checkpoint metadata '{}' = '{}' is not an integer", key,
            s);
  return value;
}

std::string incompatibility(const optim::Checkpoint& checkpoint, const NamedTensors& model_state, int world_size) {
  auto described = [&]() {
    auto it = checkpoint.state.extra.find("train.model");
    return it == checkpoint.state.extra.end() ? std::string() : " (it holds " + it->second + ")";
  };
  // The lambdas name their captures: clang before 16 (Debian 12's, which the sanitizer build uses) cannot
  // capture a structured binding.
  for (const auto& [name, t] : model_state) {
    auto it = std::find_if(checkpoint.model.begin(), checkpoint.model.end(),
                           [&n = name](const auto& entry) { return entry.first == n; });
    if (it == checkpoint.model.end()) {
      return fmt::format("a different model{}: it has no tensor '{}'", described(), name);
    }
    if (it->second.shape() != t.shape() || it->second.dtype() != t.dtype()) {
      return fmt::format("a different model{}: '{}' is {} {} there but {} {} in this config", described(), name,
                         dtype_name(it->second.dtype()), shape_text(it->second), dtype_name(t.dtype()), shape_text(t));
    }
  }
  for (const auto& [name, t] : checkpoint.model) {
    auto it = std::find_if(model_state.begin(), model_state.end(),
                           [&n = name](const auto& entry) { return entry.first == n; });
    if (it == model_state.end())
      return fmt::format("a different model{}: it has an extra tensor '{}'", described(), name);
  }
  if (checkpoint.state.extra.count("train.world_size")) {
    const int64_t saved = extra_int(checkpoint, "train.world_size");
    if (saved != world_size) {
      return fmt::format("a run of world size {}, this one has {} (each rank's data position depends on it)", saved,
                         world_size);
    }
  }
  return "";
}

}  // namespace dpt::train
