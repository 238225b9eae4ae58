#include "launcher.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spdlog/fmt/fmt.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <iterator>
#include <map>

#include "rendezvous/env.h"
#include "root_cause.h"

namespace dpt::run {
namespace {

using Clock = std::chrono::steady_clock;

// Signals reach the poll loop through a self-pipe: the handler only writes the signal number.
int g_signal_pipe[2] = {-1, -1};

void on_signal(int signo) {
  int saved = errno;
  unsigned char b = static_cast<unsigned char>(signo);
  [[maybe_unused]] ssize_t k = ::write(g_signal_pipe[1], &b, 1);
  errno = saved;
}

void write_all(int fd, const char* data, size_t n) {
  while (n > 0) {
    ssize_t k = ::write(fd, data, n);
    if (k < 0) {
      if (errno == EINTR) continue;
      return;  // our own output is gone (closed pipe): nothing sensible to do
    }
    data += k;
    n -= static_cast<size_t>(k);
  }
}

std::string now_text() {
  std::time_t t = std::time(nullptr);
  std::tm tm{};
  ::localtime_r(&t, &tm);
  char buf[64];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%S%z", &tm);
  return buf;
}

// One output stream of one worker: bytes are cut into lines and each line gets the rank prefix.
struct Stream {
  int fd = -1;
  int target = 1;  // our stdout or stderr
  std::string prefix;
  std::string partial;

  void emit(const char* data, size_t n) {
    partial.append(data, n);
    size_t start = 0;
    std::string out;
    for (size_t nl; (nl = partial.find('\n', start)) != std::string::npos; start = nl + 1) {
      out += prefix;
      out.append(partial, start, nl + 1 - start);
    }
    partial.erase(0, start);
    if (!out.empty()) write_all(target, out.data(), out.size());
  }
  void flush() {
    if (partial.empty()) return;
    std::string out = prefix + partial + "\n";
    partial.clear();
    write_all(target, out.data(), out.size());
  }
};

struct Worker {
  int rank = 0;
  int local_rank = 0;
  pid_t pid = -1;
  bool alive = false;
  Stream out, err;
  std::string error_file, heartbeat_file;
  int stop_signal = 0;  // the signal that stopped it (SIGSTOP, SIGTSTP, ...) while it is stopped
  std::chrono::system_clock::time_point stopped_since{};
  bool stall_reported = false;  // its current stall has been announced
};

int64_t wall_ns(std::chrono::system_clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
}

std::string signal_text(int signo) {
  const char* abbrev = sigabbrev_np(signo);
  return abbrev ? std::string("SIG") + abbrev : "signal " + std::to_string(signo);
}

// The scheduler state of process `pid` from /proc ("T (stopped)", "D (disk sleep)"...), or "".
std::string process_state(const std::string& pid) {
  std::ifstream in("/proc/" + pid + "/stat");
  std::string stat((std::istreambuf_iterator<char>(in)), {});
  auto paren = stat.rfind(')');  // the command name may itself hold spaces and parentheses
  if (paren == std::string::npos || paren + 2 >= stat.size()) return "";
  switch (stat[paren + 2]) {
    case 'T':
      return "T (stopped)";
    case 't':
      return "t (stopped by a debugger)";
    case 'D':
      return "D (waiting for I/O that does not return)";
    case 'Z':
      return "Z (exited, not reaped)";
    default:
      return std::string(1, stat[paren + 2]);
  }
}

// How long `w` has made no progress (0: it has), and how that shows: stopped by a signal (seen at
// once), or a heartbeat file older than the timeout (a frozen process, whatever its state).
double stalled_for(const Worker& w, double heartbeat_timeout_s, std::string* how) {
  auto now = std::chrono::system_clock::now();
  if (w.stop_signal != 0) {
    *how = "stopped by " + signal_text(w.stop_signal);
    return std::max(1e-3, std::chrono::duration<double>(now - w.stopped_since).count());
  }
  struct stat st {};
  if (w.heartbeat_file.empty() || ::stat(w.heartbeat_file.c_str(), &st) != 0) return 0;
  auto beat = std::chrono::system_clock::time_point(std::chrono::duration_cast<std::chrono::system_clock::duration>(
      std::chrono::seconds(st.st_mtim.tv_sec) + std::chrono::nanoseconds(st.st_mtim.tv_nsec)));
  double age = std::chrono::duration<double>(now - beat).count();
  if (age <= heartbeat_timeout_s) return 0;
  std::string pid;
  std::ifstream(w.heartbeat_file) >> pid;  // the worker's own process, maybe below a wrapper of ours
  std::string state = pid.empty() ? "" : process_state(pid);
  *how = fmt::format("no heartbeat for {:.0f} s{}", age,
                     state.empty() ? "" : fmt::format("; process {} is in state {}", pid, state));
  return age;
}

void set_env(const char* name, const std::string& value) { ::setenv(name, value.c_str(), 1); }

pid_t spawn(const LaunchConfig& c, int local_rank, int attempt, int out_fd, int err_fd) {
  // Signals stay blocked across fork until the child has dropped our handlers: a SIGTERM that reached
  // the child before exec would otherwise run our handler there and write into our signal pipe.
  sigset_t all, previous;
  sigfillset(&all);
  ::sigprocmask(SIG_BLOCK, &all, &previous);
  pid_t pid = ::fork();
  if (pid != 0) {
    ::sigprocmask(SIG_SETMASK, &previous, nullptr);
    return pid;
  }
  // Child. Its own process group, so that stopping a worker also stops whatever it started.
  for (int s : {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGCHLD, SIGPIPE}) ::signal(s, SIG_DFL);
  ::close(g_signal_pipe[0]);
  ::close(g_signal_pipe[1]);
  ::setpgid(0, 0);
  ::dup2(out_fd, 1);
  ::dup2(err_fd, 2);
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  int world = c.nnodes * c.nproc_per_node;
  set_env("RANK", std::to_string(c.node_rank * c.nproc_per_node + local_rank));
  set_env("LOCAL_RANK", std::to_string(local_rank));
  set_env("GROUP_RANK", std::to_string(c.node_rank));
  set_env("WORLD_SIZE", std::to_string(world));
  set_env("LOCAL_WORLD_SIZE", std::to_string(c.nproc_per_node));
  set_env("MASTER_ADDR", c.master_addr);
  set_env("MASTER_PORT", std::to_string(c.master_port));
  set_env("DPT_RESTART_COUNT", std::to_string(attempt));
  set_env("DPT_MAX_RESTARTS", std::to_string(c.max_restarts));
  if (!c.job_id.empty()) set_env("DPT_JOB_ID", c.job_id);
  // torchrun's names for the same, for programs written against it.
  set_env("TORCHELASTIC_RESTART_COUNT", std::to_string(attempt));
  set_env("TORCHELASTIC_MAX_RESTARTS", std::to_string(c.max_restarts));
  if (!c.job_id.empty()) set_env("TORCHELASTIC_RUN_ID", c.job_id);
  // Rank 0 gets the rendezvous socket this launcher bound (it stays open here across restarts, so no
  // other program can take the port in between); nobody else inherits it.
  ::unsetenv("DPT_STORE_FD");
  if (c.store_fd >= 0 && c.node_rank == 0 && local_rank == 0) {
    ::fcntl(c.store_fd, F_SETFD, 0);
    set_env("DPT_STORE_FD", std::to_string(c.store_fd));
  }
  ::unsetenv("DPT_ERROR_FILE");
  ::unsetenv("DPT_HEARTBEAT_FILE");
  if (!c.report_dir.empty()) {
    int rank = c.node_rank * c.nproc_per_node + local_rank;
    set_env("DPT_ERROR_FILE", c.report_dir + "/rank" + std::to_string(rank) + ".error");
    set_env("DPT_HEARTBEAT_FILE", c.report_dir + "/rank" + std::to_string(rank) + ".heartbeat");
  }
  ::setenv("NCCL_NVLS_ENABLE", "0", 0);  // NVLink SHARP off unless the user asked for it
  if (c.nproc_per_node > 1) ::setenv("OMP_NUM_THREADS", "1", 0);  // workers must not oversubscribe cores
  std::vector<char*> argv;
  for (const auto& a : c.command) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  ::execvp(argv[0], argv.data());
  std::string msg = "dpt-run: cannot execute '";
  msg += c.command[0];
  msg += "': ";
  msg += std::strerror(errno);
  msg += "\n";
  write_all(2, msg.data(), msg.size());
  ::_exit(127);
}

}  // namespace

void install_signal_handlers() {
  if (::pipe2(g_signal_pipe, O_CLOEXEC | O_NONBLOCK) != 0) {
    std::perror("dpt-run: pipe");
    std::exit(1);
  }
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  for (int s : {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGCHLD}) ::sigaction(s, &sa, nullptr);
  ::signal(SIGPIPE, SIG_IGN);
}

GroupResult run_worker_group(const LaunchConfig& c, int attempt) {
  GroupResult result;
  std::vector<Worker> workers(static_cast<size_t>(c.nproc_per_node));
  std::vector<WorkerOutcome> outcomes(workers.size());
  std::vector<WorkerExit> exits(workers.size());
  std::map<pid_t, size_t> by_pid;
  for (int lr = 0; lr < c.nproc_per_node; ++lr) {
    Worker& w = workers[static_cast<size_t>(lr)];
    w.local_rank = lr;
    w.rank = c.node_rank * c.nproc_per_node + lr;
    if (!c.report_dir.empty()) {
      // Reports of an earlier attempt must not be taken for this one's.
      w.error_file = c.report_dir + "/rank" + std::to_string(w.rank) + ".error";
      w.heartbeat_file = c.report_dir + "/rank" + std::to_string(w.rank) + ".heartbeat";
      ::unlink(w.error_file.c_str());
      ::unlink(w.heartbeat_file.c_str());
    }
    int out[2], err[2];
    if (::pipe2(out, O_CLOEXEC) != 0 || ::pipe2(err, O_CLOEXEC) != 0) {
      std::perror("dpt-run: pipe");
      std::exit(1);
    }
    w.pid = spawn(c, lr, attempt, out[1], err[1]);
    if (w.pid < 0) {
      std::perror("dpt-run: fork");
      std::exit(1);
    }
    ::setpgid(w.pid, w.pid);  // also from the parent: no race with the first kill below
    ::close(out[1]);
    ::close(err[1]);
    w.alive = true;
    std::string prefix = "[";  // built by appends: GCC 12 misreports "literal" + string (-Wrestrict)
    prefix += std::to_string(w.rank);
    prefix += "]: ";
    w.out = Stream{out[0], 1, prefix, {}};
    w.err = Stream{err[0], 2, prefix, {}};
    by_pid[w.pid] = static_cast<size_t>(lr);
    outcomes[static_cast<size_t>(lr)].rank = w.rank;
  }

  int alive = c.nproc_per_node;
  bool stopping = false;
  Clock::time_point kill_at{};
  bool killed = false;
  Clock::time_point drain_until{};
  Clock::time_point next_progress_check = Clock::now();

  auto signal_all = [&](int signo) {
    for (auto& w : workers)
      if (w.alive) ::kill(-w.pid, signo);
  };
  auto begin_stop = [&](int signo) {
    signal_all(signo);
    signal_all(SIGCONT);  // a stopped worker could not act on the signal (nor die of it) otherwise
    if (!stopping) {
      stopping = true;
      kill_at = Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(c.grace_period_s * 1000));
    }
  };
  // Names each worker that has stopped making progress, once per stall.
  auto check_progress = [&] {
    for (auto& w : workers) {
      if (!w.alive) continue;
      std::string how;
      double stalled = stalled_for(w, c.heartbeat_timeout_s, &how);
      if (stalled == 0) {
        w.stall_reported = false;
      } else if (!w.stall_reported) {
        w.stall_reported = true;
        std::string line = fmt::format(
            "dpt-run: rank {} (pid {}) has stopped making progress: {}; its peers will "
            "fail when their collective timeout passes\n",
            w.rank, w.pid, how);
        write_all(2, line.data(), line.size());
      }
    }
  };

  while (true) {
    std::vector<pollfd> fds;
    std::vector<Stream*> streams;
    fds.push_back({g_signal_pipe[0], POLLIN, 0});
    streams.push_back(nullptr);
    for (auto& w : workers) {
      for (Stream* s : {&w.out, &w.err}) {
        if (s->fd >= 0) {
          fds.push_back({s->fd, POLLIN, 0});
          streams.push_back(s);
        }
      }
    }
    bool pipes_open = fds.size() > 1;
    if (alive == 0) {
      if (!pipes_open) break;
      if (drain_until == Clock::time_point{}) drain_until = Clock::now() + std::chrono::seconds(2);
      if (Clock::now() >= drain_until) break;  // a grandchild keeps a pipe open: stop waiting for it
    }
    // Wake at least once a second while workers run, to watch their progress.
    auto wake = alive == 0 ? drain_until
                           : std::min(next_progress_check, stopping && !killed ? kill_at : Clock::time_point::max());
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(wake - Clock::now()).count();
    int timeout_ms = static_cast<int>(std::clamp<int64_t>(left + 1, 0, 1000));
    int rc = ::poll(fds.data(), fds.size(), timeout_ms);
    if (rc < 0 && errno != EINTR) {
      std::perror("dpt-run: poll");
      std::exit(1);
    }
    if (stopping && !killed && alive > 0 && Clock::now() >= kill_at) {
      // Grace period over: whoever ignored SIGTERM is killed.
      signal_all(SIGKILL);
      killed = true;
    }
    if (!stopping && alive > 0 && Clock::now() >= next_progress_check) {
      check_progress();
      next_progress_check = Clock::now() + std::chrono::seconds(1);
    }
    if (rc > 0) {
      for (size_t i = 1; i < fds.size(); ++i) {
        if (!(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
        Stream* s = streams[i];
        char buf[65536];
        ssize_t n = ::read(s->fd, buf, sizeof(buf));
        if (n > 0) {
          s->emit(buf, static_cast<size_t>(n));
        } else if (n == 0 || (errno != EINTR && errno != EAGAIN)) {
          s->flush();
          ::close(s->fd);
          s->fd = -1;
        }
      }
      if (fds[0].revents & POLLIN) {
        unsigned char sigs[64];
        ssize_t n = ::read(g_signal_pipe[0], sigs, sizeof(sigs));
        for (ssize_t i = 0; i < n; ++i) {
          int signo = sigs[i];
          if (signo == SIGCHLD) continue;  // reaped below in any case
          if (result.user_signal != 0 && stopping) {
            signal_all(SIGKILL);  // a second interrupt: stop waiting
            killed = true;
          } else {
            result.user_signal = signo;
            begin_stop(signo);  // forward what we received
          }
        }
      }
    }
    // Reap every worker that ended; note those stopped or continued by a signal.
    while (true) {
      int status = 0;
      pid_t pid = ::waitpid(-1, &status, WNOHANG | WUNTRACED | WCONTINUED);
      if (pid <= 0) break;
      auto it = by_pid.find(pid);
      if (it == by_pid.end()) continue;
      Worker& w = workers[it->second];
      if (WIFSTOPPED(status)) {
        w.stop_signal = WSTOPSIG(status);
        w.stopped_since = std::chrono::system_clock::now();
        if (!stopping) check_progress();
        continue;
      }
      if (WIFCONTINUED(status)) {
        w.stop_signal = 0;
        continue;
      }
      w.alive = false;
      w.stop_signal = 0;
      --alive;
      WorkerExit& e = exits[it->second];
      e.rank = w.rank;
      e.local_rank = w.local_rank;
      e.pid = pid;
      e.time = now_text();
      if (WIFSIGNALED(status)) {
        e.signal = WTERMSIG(status);
      } else {
        e.exit_code = WEXITSTATUS(status);
      }
      WorkerOutcome& o = outcomes[it->second];
      o.failed = e.signal != 0 || e.exit_code != 0;
      o.ended_by_launcher = stopping;
      o.exit_time_ns = wall_ns(std::chrono::system_clock::now());
      if (o.failed && !stopping) {
        // The group is lost. What each survivor was doing right now tells who stalled it.
        for (size_t k = 0; k < workers.size(); ++k)
          if (workers[k].alive)
            outcomes[k].stalled_s = stalled_for(workers[k], c.heartbeat_timeout_s, &outcomes[k].stall);
        begin_stop(SIGTERM);
      }
    }
  }
  result.success = !stopping && result.user_signal == 0;
  if (result.success || result.user_signal != 0) return result;
  for (size_t k = 0; k < workers.size(); ++k)
    if (!workers[k].error_file.empty()) outcomes[k].report = dist::read_error_report(workers[k].error_file);
  if (auto cause = find_root_cause(outcomes)) {
    result.root_cause = exits[cause->index];
    result.why = cause->reason;
    if (outcomes[cause->index].report && cause->report_is_cause) result.error = outcomes[cause->index].report->message;
  }
  return result;
}

}  // namespace dpt::run
