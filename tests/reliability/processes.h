#pragma once
// Helpers of the reliability tests: start programs (dpt-run, the trainer) as child processes whose
// output goes to a file, and wait for them with a deadline (a process still running at the deadline is
// killed and reported as hung, so a test fails instead of hanging the suite).
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

// A check that `text` contains `part`, printing the whole text when it does not.
#define EXPECT_CONTAINS(text, part) EXPECT_NE(std::string(text).find(part), std::string::npos) << (text)

namespace dpt::reliability {

// True when a user with no privileges and no group in common can reach `path`: it and every directory on
// the way have the others-execute bit (tests that run a program as another user need this).
inline bool reachable_by_others(const std::filesystem::path& path) {
  for (std::filesystem::path p = std::filesystem::absolute(path);; p = p.parent_path()) {
    struct stat st {};
    if (::stat(p.c_str(), &st) != 0 || (st.st_mode & S_IXOTH) == 0) return false;
    if (p == p.root_path()) return true;
  }
}

// Where dpt-train saves the checkpoint of `step` in run directory `run` ("run/step_00000020").
inline std::string step_dir(const std::string& run, int64_t step) {
  char name[32];
  std::snprintf(name, sizeof(name), "step_%08lld", static_cast<long long>(step));
  return (std::filesystem::path(run) / name).string();
}

inline const std::string kBin = DPT_BINARY_DIR "/bin/";

struct Finished {
  int exit_code = -1;  // 128 + signal for a signal, like a shell; -1 when it hung and was killed
  bool hung = false;
  double seconds = 0;
  std::string output;  // stdout and stderr together
};

class Child {
 public:
  // Starts `argv` (argv[0] a path) with `env` ("NAME=value") added to this process's environment.
  Child(const std::vector<std::string>& argv, const std::string& log_path, const std::vector<std::string>& env = {})
      : log_path_(log_path), start_(std::chrono::steady_clock::now()) {
    pid_ = ::fork();
    if (pid_ == 0) {
      ::setpgid(0, 0);  // its own process group, so a hung child and its workers can be killed together
      int fd = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      ::dup2(fd, 1);
      ::dup2(fd, 2);
      for (const auto& e : env) ::putenv(const_cast<char*>(e.c_str()));
      std::vector<char*> args;
      for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
      args.push_back(nullptr);
      ::execv(args[0], args.data());
      ::_exit(127);
    }
  }
  ~Child() {
    if (pid_ > 0 && !reaped_) {
      ::kill(-pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;

  int pid() const { return pid_; }
  void signal(int sig) { ::kill(pid_, sig); }
  std::string output() const {
    std::ifstream in(log_path_);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  }

  // Waits until the child exits or `limit` seconds after its start have passed (then kills it).
  Finished wait(double limit_s) {
    Finished f;
    int status = 0;
    while (true) {
      pid_t r = ::waitpid(pid_, &status, WNOHANG);
      if (r == pid_) break;
      if (elapsed() > limit_s) {
        ::kill(-pid_, SIGKILL);
        ::waitpid(pid_, &status, 0);
        f.hung = true;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    reaped_ = true;
    f.seconds = elapsed();
    if (!f.hung) f.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    f.output = output();
    return f;
  }

  // Waits (up to `limit_s` from the start) until the output contains `text`.
  bool wait_for_output(const std::string& text, double limit_s) {
    while (elapsed() < limit_s) {
      if (output().find(text) != std::string::npos) return true;
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        reaped_ = true;
        return output().find(text) != std::string::npos;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return false;
  }

 private:
  double elapsed() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  }
  std::string log_path_;
  pid_t pid_ = -1;
  bool reaped_ = false;
  std::chrono::steady_clock::time_point start_;
};

// A fresh directory per test under the build tree, removed afterwards.
class ScratchDir {
 public:
  ScratchDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    path_ = std::filesystem::path(DPT_BINARY_DIR) / "test_tmp" /
            (std::string(info->test_suite_name()) + "." + info->name() + "." + std::to_string(::getpid()));
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::permissions(path_, std::filesystem::perms::owner_all, std::filesystem::perm_options::add, ec);
    std::filesystem::remove_all(path_, ec);
  }
  std::string file(const std::string& name) const { return (path_ / name).string(); }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

// The rendezvous port that dpt-run bound on node 0 (started with --standalone or --master-port 0), as it
// prints it; -1 if it did not within `limit_s`. Tests never choose a port themselves: one found free could
// be taken by another test before the store binds it.
inline int rendezvous_port(Child& node0, double limit_s) {
  const std::string marker = "dpt-run: rendezvous store on ";
  if (!node0.wait_for_output(marker, limit_s)) return -1;
  auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(limit_s);
  while (std::chrono::steady_clock::now() < until) {
    std::string out = node0.output();
    size_t at = out.find(marker);
    size_t end = out.find('\n', at);
    if (end != std::string::npos) {
      std::string address = out.substr(at + marker.size(), end - at - marker.size());
      return std::stoi(address.substr(address.rfind(':') + 1));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return -1;
}

// The worker of dpt-run `launcher` whose environment says RANK=<rank>, or 0 when there is none.
inline pid_t rank_pid(pid_t launcher, int rank) {
  std::ifstream children("/proc/" + std::to_string(launcher) + "/task/" + std::to_string(launcher) + "/children");
  for (pid_t pid; children >> pid;) {
    std::ifstream env("/proc/" + std::to_string(pid) + "/environ", std::ios::binary);
    std::string all((std::istreambuf_iterator<char>(env)), {});
    if (all.find(std::string("\0RANK=", 6) + std::to_string(rank) + '\0') != std::string::npos) return pid;
  }
  return 0;
}

inline int count(const std::string& text, const std::string& part) {
  int c = 0;
  for (size_t pos = text.find(part); pos != std::string::npos; pos = text.find(part, pos + part.size())) ++c;
  return c;
}

}  // namespace dpt::reliability
