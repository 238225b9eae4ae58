// dpt-run: starts the workers of a data-parallel job on this node, the way torchrun does.
//
//   dpt-run --nproc-per-node N [--nnodes M --node-rank R --master-addr A --master-port P]
//           [--max-restarts K] [--standalone] [--grace-period S] -- PROGRAM ARGS...
//
// Each worker gets RANK, LOCAL_RANK, GROUP_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT
// and DPT_RESTART_COUNT; every output line is prefixed with "[rank]: ". When a worker fails the others
// are stopped, and the whole group is started again, up to K times; then dpt-run exits with the failing
// worker's code (128 + signal number for a signal) after a root-cause report.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <string>

#include "distributed/socket.h"
#include "launcher.h"

namespace {

constexpr const char* kUsage =
    "usage: dpt-run --nproc-per-node N [--nnodes M --node-rank R --master-addr A --master-port P]\n"
    "               [--max-restarts K] [--standalone] [--grace-period SECONDS] -- PROGRAM ARGS...\n"
    "  --standalone      single node; rendezvous on a free port of localhost\n"
    "  --max-restarts K  restart the whole worker group up to K times after a failure (default 0)\n"
    "  --grace-period S  seconds between SIGTERM and SIGKILL when stopping workers (default 5)\n";

[[noreturn]] void usage_error(const std::string& message) {
  std::fprintf(stderr, "dpt-run: %s\n%s", message.c_str(), kUsage);
  std::exit(2);
}

int parse_int(const std::string& flag, const std::string& value, int min, int max) {
  char* end = nullptr;
  long v = std::strtol(value.c_str(), &end, 10);
  if (value.empty() || *end != '\0' || v < min || v > max)
    usage_error(flag + " expects an integer in [" + std::to_string(min) + ", " + std::to_string(max) + "], got '" +
                value + "'");
  return static_cast<int>(v);
}

}  // namespace

int main(int argc, char** argv) {
  dpt::run::LaunchConfig config;
  bool standalone = false;
  bool have_addr = false, have_port = false;
  int i = 1;
  for (; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--") {
      ++i;
      break;
    }
    if (arg == "-h" || arg == "--help") {
      std::fputs(kUsage, stdout);
      return 0;
    }
    if (arg == "--standalone") {
      standalone = true;
      continue;
    }
    // Accept both "--flag value" and "--flag=value".
    std::string value;
    auto eq = arg.find('=');
    if (arg.rfind("--", 0) == 0 && eq != std::string::npos) {
      value = arg.substr(eq + 1);
      arg = arg.substr(0, eq);
    } else if (arg.rfind("--", 0) == 0) {
      if (i + 1 >= argc) usage_error(arg + " needs a value");
      value = argv[++i];
    } else {
      usage_error("expected an option or '--' before the program, got '" + arg + "'");
    }
    if (arg == "--nproc-per-node" || arg == "--nproc_per_node") {
      config.nproc_per_node = parse_int(arg, value, 1, 4096);
    } else if (arg == "--nnodes") {
      config.nnodes = parse_int(arg, value, 1, 1 << 20);
    } else if (arg == "--node-rank" || arg == "--node_rank") {
      config.node_rank = parse_int(arg, value, 0, 1 << 20);
    } else if (arg == "--master-addr" || arg == "--master_addr") {
      config.master_addr = value;
      have_addr = true;
    } else if (arg == "--master-port" || arg == "--master_port") {
      config.master_port = parse_int(arg, value, 1, 65535);
      have_port = true;
    } else if (arg == "--max-restarts" || arg == "--max_restarts") {
      config.max_restarts = parse_int(arg, value, 0, 1000000);
    } else if (arg == "--grace-period") {
      char* end = nullptr;
      config.grace_period_s = std::strtod(value.c_str(), &end);
      if (value.empty() || *end != '\0' || config.grace_period_s < 0)
        usage_error("--grace-period expects a non-negative number of seconds, got '" + value + "'");
    } else {
      usage_error("unknown option " + arg);
    }
  }
  for (; i < argc; ++i) config.command.push_back(argv[i]);
  if (config.command.empty()) usage_error("no program given (put it after '--')");
  if (config.node_rank >= config.nnodes)
    usage_error("--node-rank " + std::to_string(config.node_rank) + " must be below --nnodes " +
                std::to_string(config.nnodes));
  if (standalone) {
    if (config.nnodes != 1) usage_error("--standalone runs on one node; --nnodes must be 1");
    if (have_addr || have_port) usage_error("--standalone picks the master address and port itself");
    config.master_addr = "127.0.0.1";
    try {
      config.master_port = dpt::dist::net::find_free_port();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "dpt-run: %s\n", e.what());
      return 1;
    }
  }

  dpt::run::install_signal_handlers();
  for (int attempt = 0;; ++attempt) {
    auto result = dpt::run::run_worker_group(config, attempt);
    if (result.success) return 0;
    if (result.user_signal != 0) {
      std::fprintf(stderr, "dpt-run: received %s; workers stopped\n", strsignal(result.user_signal));
      return 128 + result.user_signal;
    }
    const auto& e = result.root_cause;
    if (attempt < config.max_restarts) {
      std::fprintf(stderr, "dpt-run: rank %d failed (%s %d); restarting the worker group (restart %d of %d)\n",
                   e.rank, e.signal ? "signal" : "exit code", e.signal ? e.signal : e.exit_code, attempt + 1,
                   config.max_restarts);
      continue;
    }
    std::string reason = e.signal ? std::to_string(e.signal) + " (" + strsignal(e.signal) + ")" : "";
    std::fprintf(stderr,
                 "dpt-run: ==================== worker failure ====================\n"
                 "dpt-run: root cause (first worker to fail):\n"
                 "dpt-run:   time       : %s\n"
                 "dpt-run:   rank       : %d (local rank %d, node %d)\n"
                 "dpt-run:   %s: %s\n"
                 "dpt-run:   pid        : %d\n"
                 "dpt-run:   attempts   : %d (max restarts %d)\n"
                 "dpt-run:   command    : %s\n"
                 "dpt-run: ========================================================\n",
                 e.time.c_str(), e.rank, e.local_rank, config.node_rank, e.signal ? "signal     " : "exit code  ",
                 e.signal ? reason.c_str() : std::to_string(e.exit_code).c_str(), e.pid, attempt + 1,
                 config.max_restarts, config.command[0].c_str());
    return e.shell_code();
  }
}
