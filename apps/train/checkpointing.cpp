#include "checkpointing.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <filesystem>
#include <new>
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

// The process id in the name of a temporary step directory, step_<digits>.tmp-<pid>, or nullopt.
struct Leftover {
  pid_t pid = 0;
};
std::optional<Leftover> parse_leftover(const std::string& name) {
  static const std::regex pattern("step_[0-9]+\\.tmp-([0-9]+)");
  std::smatch m;
  if (!std::regex_match(name, m, pattern)) return std::nullopt;
  pid_t pid = 0;
  const std::string digits = m[1].str();
  auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), pid);
  if (ec != std::errc() || end != digits.data() + digits.size() || pid <= 0) return std::nullopt;
  return Leftover{pid};
}

// False only when no process `pid` exists (a process of another user still counts as alive).
bool process_alive(pid_t pid) { return ::kill(pid, 0) == 0 || errno != ESRCH; }

// A free name beside `path` for setting it aside: path.set-aside-<pid>[-k].
fs::path set_aside_name(const fs::path& path) {
  const std::string base = path.string() + fmt::format(".set-aside-{}", ::getpid());
  fs::path candidate = base;
  for (int k = 1; fs::exists(fs::symlink_status(candidate)); ++k) candidate = base + fmt::format("-{}", k);
  return candidate;
}

fs::path set_aside(const fs::path& path) {
  const fs::path to = set_aside_name(path);
  fs::rename(path, to);
  return to;
}

// Any failure to read a checkpoint but proven damage: resuming from an older one instead would silently
// drop this one's progress (and a later save's retention could delete it).
[[noreturn]] void unreadable(const std::string& checkpoint, const std::string& why, const std::string& dir) {
  DPT_FAIL(
      "cannot read checkpoint '{}': {}. It is not known to be damaged, so the run stops instead of starting from "
      "an older checkpoint; nothing in '{}' was changed. Fix the cause and run again",
      checkpoint, why, dir);
}

// Whether `path` exists; false only for "no such file" (any other failure to look is an error).
bool present(const fs::path& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0) return true;
  DPT_CHECK(errno == ENOENT || errno == ENOTDIR, "cannot look at '{}': {}", path.string(), std::strerror(errno));
  return false;
}

}  // namespace

std::string checkpoint_path(const std::string& dir, int64_t step) {
  return (fs::path(dir) / fmt::format("step_{:08d}", step)).string();
}

std::vector<CheckpointEntry> list_checkpoints(const std::string& dir, std::vector<std::string>* ignored) {
  std::vector<CheckpointEntry> out;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return out;
  static const std::regex pattern("step_([0-9]+)");
  for (const auto& e : fs::directory_iterator(dir)) {
    std::smatch m;
    const std::string name = e.path().filename().string();
    if (!e.is_directory() || !std::regex_match(name, m, pattern)) continue;
    const std::string digits = m[1].str();
    int64_t step = 0;
    auto [end, parse_error] = std::from_chars(digits.data(), digits.data() + digits.size(), step);
    if (parse_error != std::errc() || end != digits.data() + digits.size()) {
      if (ignored) ignored->push_back(fmt::format("{}: the step number does not fit 64 bits", e.path().string()));
      continue;
    }
    out.push_back({step, e.path().string()});
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
  // Into place. A checkpoint of the same step already there is not this run's (its steps only grow):
  // it is set aside, not deleted, once the new one is complete.
  if (fs::exists(final_path)) set_aside(final_path);
  fs::rename(tmp, final_path);
  fsync_dir(dir);
  // Retention: anything newer than this step belongs to another run and is set aside; of the rest, the
  // newest `keep` stay.
  std::vector<CheckpointEntry> kept;
  for (const auto& e : list_checkpoints(dir)) {
    if (e.step > state.step) {
      set_aside(e.path);
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
  const bool step_dir = fs::is_directory(p);
  if (step_dir) {
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
  for (const char* suffix : {".model.safetensors", ".optim.safetensors"}) {
    if (present(prefix + suffix)) continue;
    // A step directory appears complete (it is renamed into place), so one without its files is damage.
    const std::string what =
        fmt::format("checkpoint '{}': {}{} is missing (a checkpoint is {}.model.safetensors and .optim.safetensors)",
                    path, prefix, suffix, prefix);
    if (step_dir) throw DamagedFile(what);
    DPT_FAIL("{}", what);
  }
  return optim::load_checkpoint(prefix);
}

std::optional<FoundCheckpoint> find_newest_valid(const std::string& dir, std::vector<std::string>* skipped,
                                                 std::vector<std::string>* ignored) {
  std::vector<CheckpointEntry> all = list_checkpoints(dir, ignored);
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    try {
      optim::Checkpoint checkpoint = load_run_checkpoint(it->path);
      if (checkpoint.state.step != it->step) {
        throw DamagedFile(
            fmt::format("it holds step {}, not the step {} its name says", checkpoint.state.step, it->step));
      }
      return FoundCheckpoint{*it, std::move(checkpoint)};
    } catch (const DamagedFile& e) {
      if (skipped) skipped->push_back(fmt::format("{}: {}", it->path, e.what()));
    } catch (const std::bad_alloc&) {
      unreadable(it->path, "out of memory", dir);
    } catch (const std::exception& e) {
      unreadable(it->path, e.what(), dir);
    }
  }
  return std::nullopt;
}

std::vector<std::string> set_aside_newer(const std::string& dir, int64_t step) {
  std::vector<std::string> moved;
  for (const auto& e : list_checkpoints(dir)) {
    if (e.step <= step) continue;
    const fs::path to = set_aside(e.path);
    moved.push_back(fmt::format("{} -> {}", e.path, to.string()));
  }
  if (!moved.empty()) fsync_dir(dir);
  return moved;
}

std::vector<std::string> clean_leftovers(const std::string& dir) {
  std::vector<std::string> removed;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return removed;
  std::vector<std::pair<fs::path, pid_t>> dead;
  for (const auto& e : fs::directory_iterator(dir)) {
    auto tmp = parse_leftover(e.path().filename().string());
    if (tmp && !process_alive(tmp->pid)) dead.emplace_back(e.path(), tmp->pid);
  }
  for (const auto& [path, pid] : dead) {
    fs::remove_all(path);
    removed.push_back(fmt::format("removed {}, an unfinished save of process {}, which is gone", path.string(), pid));
  }
  return removed;
}

namespace {

// The whole entry must read as a T: "1.5x" is refused, not read as 1.5. `kind` names T in the error.
template <class T>
T extra_number(const optim::Checkpoint& checkpoint, const std::string& key, const char* kind) {
  auto it = checkpoint.state.extra.find(key);
  DPT_CHECK(it != checkpoint.state.extra.end(), "checkpoint metadata has no '{}' (not written by dpt-train?)", key);
  T value = 0;
  const std::string& s = it->second;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
  DPT_CHECK(ec == std::errc() && end == s.data() + s.size(), "checkpoint metadata '{}' = '{}' is not {}", key, s, kind);
  return value;
}

}  // namespace

int64_t extra_int(const optim::Checkpoint& checkpoint, const std::string& key) {
  return extra_number<int64_t>(checkpoint, key, "an integer");
}

double extra_double(const optim::Checkpoint& checkpoint, const std::string& key) {
  return extra_number<double>(checkpoint, key, "a number");
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
