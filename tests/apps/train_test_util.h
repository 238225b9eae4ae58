#pragma once
// Helpers of the dpt-train tests: run the trainer (directly, or through dpt-run), read its metrics
// JSONL, compare histories, and scratch directories under the build tree.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

namespace dpt::train::test_util {

namespace fs = std::filesystem;

class ScratchDir {
 public:
  explicit ScratchDir(const std::string& name) {
    path_ = fs::path(DPT_BINARY_DIR) / "test_tmp" / ("train." + name + "." + std::to_string(::getpid()));
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~ScratchDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  std::string file(const std::string& name) const { return (path_ / name).string(); }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

inline std::string bin(const std::string& program) { return std::string(DPT_BINARY_DIR) + "/bin/" + program; }
inline std::string config_path(const std::string& name) { return std::string(DPT_SOURCE_DIR) + "/configs/" + name; }

inline std::string quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

struct RunResult {
  int exit_code = -1;
  std::string output;  // stdout and stderr
};

inline RunResult run_shell(const std::string& command) {
  RunResult r;
  std::FILE* pipe = ::popen((command + " 2>&1").c_str(), "r");
  if (!pipe) return r;
  std::array<char, 4096> buf;
  while (std::fgets(buf.data(), static_cast<int>(buf.size()), pipe)) r.output += buf.data();
  const int status = ::pclose(pipe);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return r;
}

inline std::string train_command(const std::string& config, const std::vector<std::string>& overrides, int nproc) {
  std::string cmd;
  if (nproc > 1) cmd = bin("dpt-run") + " --standalone --nproc-per-node " + std::to_string(nproc) + " -- ";
  cmd += bin("dpt-train") + " --config " + quote(config);
  for (const auto& o : overrides) cmd += " --set " + quote(o);
  return cmd;
}

// dpt-train with `overrides`, as one process or `nproc` processes under dpt-run.
inline RunResult train(const std::string& config, const std::vector<std::string>& overrides, int nproc = 1) {
  if (!fs::exists(bin("dpt-train"))) {
    ADD_FAILURE() << bin("dpt-train") << " is not built (build the dpt-train and dpt-run targets)";
    return {};
  }
  return run_shell(train_command(config, overrides, nproc));
}

// A trainer running in the background, its output in a file.
struct Child {
  pid_t pid = -1;
  bool running() const { return ::waitpid(pid, nullptr, WNOHANG) == 0; }
  int wait() const {
    int status = 0;
    ::waitpid(pid, &status, 0);
    return status;
  }
};

inline Child spawn_train(const std::string& config, const std::vector<std::string>& overrides,
                         const std::string& log_file) {
  const std::string cmd = "exec " + train_command(config, overrides, 1);  // exec: the signal reaches dpt-train
  Child c;
  c.pid = ::fork();
  if (c.pid == 0) {
    int fd = ::open(log_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(fd, 1);
    ::dup2(fd, 2);
    ::execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  return c;
}

inline std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// Every file under `dir` with its bytes: equal snapshots mean nothing was written.
inline std::map<std::string, std::string> snapshot(const std::string& dir) {
  std::map<std::string, std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.is_regular_file()) out[e.path().string()] = read_text(e.path().string());
  return out;
}

// One metrics record; numbers kept as the text the trainer wrote, so equality is digit for digit.
struct Record {
  std::string line;
  std::string type;
  int64_t step = -1;
  std::string loss, lr, grad_norm, val_loss;
  bool skipped = false;
};

// A field of a record as its JSON text (numbers as written, strings unquoted); "" when it is missing.
inline std::string json_field(const nlohmann::json& record, const std::string& key) {
  const auto it = record.find(key);
  if (it == record.end()) return "";
  return it->is_string() ? it->get<std::string>() : it->dump();
}

// The same, of one line of JSONL.
inline std::string field(const std::string& line, const std::string& key) {
  const nlohmann::json record = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
  return record.is_object() ? json_field(record, key) : "";
}

// The records of a metrics JSONL file; a line that is not a JSON object (one being written) is skipped.
inline std::vector<Record> read_metrics(const std::string& path) {
  std::vector<Record> out;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    const nlohmann::json record = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!record.is_object()) continue;
    Record r;
    r.line = line;
    r.type = json_field(record, "type");
    r.step = record.value("step", int64_t{-1});
    r.loss = json_field(record, "loss");
    r.lr = json_field(record, "lr");
    r.grad_norm = json_field(record, "grad_norm");
    r.val_loss = json_field(record, "val_loss");
    r.skipped = record.value("skipped", false);
    out.push_back(r);
  }
  return out;
}

inline std::vector<Record> of_type(const std::vector<Record>& records, const std::string& type) {
  std::vector<Record> out;
  for (const auto& r : records)
    if (r.type == type) out.push_back(r);
  return out;
}
inline std::vector<Record> train_records(const std::vector<Record>& r) { return of_type(r, "train"); }
inline std::vector<Record> eval_records(const std::vector<Record>& r) { return of_type(r, "eval"); }

inline double number(const std::string& s) { return s == "null" || s.empty() ? std::nan("") : std::stod(s); }

// Same steps in the same order with identical loss, learning rate, gradient norm and validation loss.
inline void expect_same_history(const std::vector<Record>& expected, const std::vector<Record>& actual,
                                int64_t last_step) {
  ASSERT_EQ(actual.size(), expected.size());
  ASSERT_FALSE(expected.empty());
  EXPECT_EQ(expected.back().step, last_step);
  for (size_t i = 0; i < expected.size(); ++i) {
    SCOPED_TRACE("record " + std::to_string(i) + ": " + expected[i].line + "\n  vs " + actual[i].line);
    EXPECT_EQ(actual[i].type, expected[i].type);
    EXPECT_EQ(actual[i].step, expected[i].step);
    EXPECT_EQ(actual[i].loss, expected[i].loss);
    EXPECT_EQ(actual[i].lr, expected[i].lr);
    EXPECT_EQ(actual[i].grad_norm, expected[i].grad_norm);
    EXPECT_EQ(actual[i].val_loss, expected[i].val_loss);
  }
}

// The same up to float32 rounding of differently ordered sums.
inline void expect_close_history(const std::vector<Record>& expected, const std::vector<Record>& actual,
                                 int64_t last_step) {
  ASSERT_EQ(actual.size(), expected.size());
  ASSERT_FALSE(expected.empty());
  EXPECT_EQ(expected.back().step, last_step);
  auto close = [](const std::string& a, const std::string& b, double rel) {
    if (a.empty() && b.empty()) return true;
    const double x = number(a), y = number(b);
    return std::abs(x - y) <= rel * std::max(std::abs(x), std::abs(y)) + 1e-7;
  };
  for (size_t i = 0; i < expected.size(); ++i) {
    SCOPED_TRACE("record " + std::to_string(i) + ": " + expected[i].line + "\n  vs " + actual[i].line);
    EXPECT_EQ(actual[i].step, expected[i].step);
    EXPECT_TRUE(close(actual[i].loss, expected[i].loss, 1e-5));
    EXPECT_EQ(actual[i].lr, expected[i].lr);
    EXPECT_TRUE(close(actual[i].grad_norm, expected[i].grad_norm, 1e-4));
    EXPECT_TRUE(close(actual[i].val_loss, expected[i].val_loss, 1e-5));
  }
}

}  // namespace dpt::train::test_util
