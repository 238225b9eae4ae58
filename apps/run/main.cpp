// dpt-run: starts the workers of a data-parallel job on this node, the way torchrun does.
//
//   dpt-run --nproc-per-node N|gpu|cpu|auto [--nnodes M --node-rank R --master-addr A --master-port P]
//           [--rdzv-endpoint HOST:PORT] [--rdzv-id ID] [--max-restarts K] [--standalone]
//           [--grace-period S] [--heartbeat-timeout S] [--] PROGRAM ARGS...
// torchrun's underscore spellings (--nproc_per_node, --master_port, ...) are accepted too.
//
// Each worker gets RANK, LOCAL_RANK, GROUP_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT,
// DPT_JOB_ID and DPT_RESTART_COUNT; every output line is prefixed with "[rank]: ". On node 0 dpt-run
// binds the rendezvous port itself before any worker starts and hands the socket to rank 0: a port that
// is taken fails at once, and a port picked by the system (--standalone, or --master-port 0) cannot be
// taken by anyone else before rank 0 listens on it. When a worker fails the others are stopped, and
// the whole group is started again, up to K times; then dpt-run exits with the root cause's code (128 +
// signal number for a signal) after a report naming it.
#include <spdlog/fmt/fmt.h>
#include <sys/random.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>

#include "command_line.h"
#include "core/cuda_runtime.h"
#include "launcher.h"
#include "rendezvous/socket.h"

namespace {

[[noreturn]] void usage_error(const std::string& message) { dpt::cli::usage_error("dpt-run", message); }

// --nproc-per-node: a count, or torchrun's gpu | cpu | auto.
int processes_per_node(const std::string& value) {
  const int gpus = value == "gpu" || value == "auto" ? dpt::cuda::device_count() : 0;
  if (value == "gpu") {
    if (gpus == 0) usage_error("--nproc-per-node gpu: no GPU is visible");
    return gpus;
  }
  if (value == "cpu" || (value == "auto" && gpus == 0)) return static_cast<int>(std::max(1L, ::sysconf(_SC_NPROCESSORS_ONLN)));
  if (value == "auto") return gpus;
  int count = 0;
  if (!CLI::detail::lexical_cast(value, count) || count < 1 || count > 4096)
    usage_error("--nproc-per-node expects gpu, cpu, auto or an integer in [1, 4096], got '" + value + "'");
  return count;
}

// torchrun's --rdzv-endpoint HOST:PORT.
void set_endpoint(const std::string& value, dpt::run::LaunchConfig& config) {
  const auto colon = value.rfind(':');
  int port = -1;
  if (colon == std::string::npos || colon == 0 || !CLI::detail::lexical_cast(value.substr(colon + 1), port) ||
      port < 0 || port > 65535)
    usage_error("--rdzv-endpoint expects HOST:PORT with a port in [0, 65535], got '" + value + "'");
  config.master_addr = value.substr(0, colon);
  config.master_port = port;
}

std::string env_or_empty(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr ? v : "";
}

// The job id every worker presents to the store. A single node makes up a fresh one. Nodes of one job
// must agree on theirs, so beyond one node only an id they share will do: the one given, else that of
// the srun step that started every node's dpt-run, else none (the workers' own default, env.h).
std::string choose_job_id(const std::string& given, int nnodes) {
  if (!given.empty()) return given;
  if (auto v = env_or_empty("DPT_JOB_ID"); !v.empty()) return v;
  if (nnodes > 1) {
    auto job = env_or_empty("SLURM_JOB_ID"), step = env_or_empty("SLURM_STEP_ID");
    return job.empty() ? "" : "slurm-" + job + (step.empty() ? "" : "." + step);
  }
  unsigned char bytes[8] = {};
  if (::getrandom(bytes, sizeof(bytes), 0) != static_cast<ssize_t>(sizeof(bytes))) {
    std::fprintf(stderr, "dpt-run: getrandom failed: %s\n", std::strerror(errno));
    std::exit(1);
  }
  std::string id = "run-";
  for (unsigned char b : bytes) id += fmt::format("{:02x}", b);
  return id;
}

// A private directory for the workers' error reports and heartbeats, removed when dpt-run ends. Without
// one (no writable temporary directory) the workers run as before, and the report names the first
// worker to fail.
struct ReportDir {
  std::string path;
  ReportDir() {
    std::string base = env_or_empty("TMPDIR");
    std::string pattern = (base.empty() ? std::string("/tmp") : base) + "/dpt-run.XXXXXX";
    if (::mkdtemp(pattern.data()) != nullptr) {
      path = pattern;
    } else {
      std::fprintf(stderr, "dpt-run: warning: cannot create %s for the workers' reports (%s)\n", pattern.c_str(),
                   std::strerror(errno));
    }
  }
  ~ReportDir() {
    std::error_code ec;
    if (!path.empty()) std::filesystem::remove_all(path, ec);
  }
};

// The first line of a worker's error, shortened for the report.
std::string first_line(const std::string& text) {
  std::string line = text.substr(0, text.find('\n'));
  return line.size() > 400 ? line.substr(0, 400) + "..." : line;
}

}  // namespace

int main(int argc, char** argv) {
  dpt::run::LaunchConfig config;
  std::string nproc = "1", endpoint, rdzv_id;
  bool standalone = false;
  CLI::App app{
      "Starts the workers of a data-parallel job on this node, the way torchrun does: each gets RANK, "
      "LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT...; a failed worker stops the group, which is "
      "restarted up to --max-restarts times.\n"
      "The program and its arguments follow the options (after '--', or at the first argument that is "
      "not an option).",
      "dpt-run"};
  app.add_option("--nproc-per-node,--nproc_per_node", nproc,
                 "processes on this node: a number, gpu (one per visible GPU), cpu (one per core), or auto (gpu "
                 "when there is a GPU, else cpu), as torchrun counts them")
      ->type_name("N|gpu|cpu|auto")
      ->capture_default_str();
  app.add_option("--nnodes", config.nnodes, "nodes of the job")->check(CLI::Range(1, 1 << 20))->capture_default_str();
  app.add_option("--node-rank,--node_rank", config.node_rank, "this node's index")
      ->check(CLI::Range(0, 1 << 20))
      ->capture_default_str();
  CLI::Option* addr =
      app.add_option("--master-addr,--master_addr", config.master_addr, "node 0's address")->capture_default_str();
  CLI::Option* port = app.add_option("--master-port,--master_port", config.master_port,
                                     "the rendezvous port; 0 on node 0 picks a free one and prints it")
                          ->check(CLI::Range(0, 65535))
                          ->capture_default_str();
  CLI::Option* rdzv = app.add_option("--rdzv-endpoint,--rdzv_endpoint", endpoint,
                                     "the same as --master-addr HOST --master-port PORT (torchrun's spelling)")
                          ->type_name("HOST:PORT");
  CLI::Option* id =
      app.add_option("--rdzv-id,--rdzv_id", rdzv_id,
                     "the job's id, the same on every node (default: $DPT_JOB_ID; else random on one node, the srun "
                     "step's id on several); the store refuses ranks of other jobs");
  app.add_flag("--standalone", standalone, "single node; rendezvous on a free port of localhost");
  app.add_option("--max-restarts,--max_restarts", config.max_restarts,
                 "restart the whole worker group up to K times after a failure")
      ->check(CLI::Range(0, 1000000))
      ->capture_default_str();
  app.add_option("--grace-period", config.grace_period_s, "seconds between SIGTERM and SIGKILL when stopping workers")
      ->check(dpt::cli::number_in(0, 1e9))
      ->capture_default_str();
  app.add_option("--heartbeat-timeout", config.heartbeat_timeout_s,
                 "a worker silent this many seconds is named as stalled (at least 3)")
      ->check(dpt::cli::number_in(3, 1e9))
      ->capture_default_str();
  // Everything from the program on is the workers' command line, as torchrun takes its script and args.
  app.prefix_command();
  dpt::cli::set_examples(app, {"dpt-run --standalone --nproc-per-node 2 -- dpt-train -c configs/char_gpt.yaml",
                               "dpt-run --nnodes 2 --node-rank 0 --nproc-per-node gpu --rdzv-endpoint head:29500 "
                               "--rdzv-id job7 dpt-train -c configs/gpt2.yaml",
                               "dpt-run --standalone --nproc_per_node=4 --max-restarts 3 -- ./my_worker --flag"});
  if (auto code = dpt::cli::parse(app, argc, argv)) return *code;
  config.command = app.remaining();
  if (!config.command.empty() && config.command.front() == "--") {
    config.command.erase(config.command.begin());
  } else if (!config.command.empty() && config.command.front().rfind('-', 0) == 0) {
    usage_error("unknown option " + config.command.front() + " (a program's own options go after '--')");
  }
  if (config.command.empty()) usage_error("no program given (put it after '--')");
  if (id->count() > 0 && (rdzv_id.empty() || rdzv_id.size() > 256))
    usage_error("--rdzv-id expects 1 to 256 characters");
  config.nproc_per_node = processes_per_node(nproc);
  if (!endpoint.empty()) set_endpoint(endpoint, config);
  const bool have_addr = addr->count() > 0 || rdzv->count() > 0, have_port = port->count() > 0 || rdzv->count() > 0;
  if (config.node_rank >= config.nnodes)
    usage_error("--node-rank " + std::to_string(config.node_rank) + " must be below --nnodes " +
                std::to_string(config.nnodes));
  if (standalone) {
    if (config.nnodes != 1) usage_error("--standalone runs on one node; --nnodes must be 1");
    if (have_addr || have_port) usage_error("--standalone picks the master address and port itself");
    config.master_addr = "127.0.0.1";
    config.master_port = 0;
  }
  if (config.master_port == 0 && config.node_rank != 0)
    usage_error("--master-port 0 is for node 0 (it picks the port); the other nodes need the port node 0 printed");
  config.job_id = choose_job_id(rdzv_id, config.nnodes);

  // Node 0 hosts the store: bind its port now, before any worker exists. A standalone job listens on
  // loopback only; it has no other node to hear from.
  const bool chosen_port = config.master_port == 0;
  if (config.node_rank == 0) {
    try {
      config.store_fd = dpt::dist::net::bind_tcp(config.master_port, standalone);
      dpt::dist::net::start_listening(config.store_fd);
      config.master_port = dpt::dist::net::bound_port(config.store_fd);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "dpt-run: %s\n", e.what());
      return 1;
    }
    if (chosen_port)
      std::fprintf(stderr, "dpt-run: rendezvous store on %s:%d\n", config.master_addr.c_str(), config.master_port);
  }
  ReportDir reports;
  config.report_dir = reports.path;

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
    std::string error = result.error.empty() ? "" : "dpt-run:   error      : " + first_line(result.error) + "\n";
    std::fprintf(stderr,
                 "dpt-run: ==================== worker failure ====================\n"
                 "dpt-run: root cause: rank %d (%s)\n"
                 "dpt-run:   time       : %s\n"
                 "dpt-run:   rank       : %d (local rank %d, node %d)\n"
                 "dpt-run:   %s: %s\n"
                 "%s"
                 "dpt-run:   pid        : %d\n"
                 "dpt-run:   attempts   : %d (max restarts %d)\n"
                 "dpt-run:   command    : %s\n"
                 "dpt-run: ========================================================\n",
                 e.rank, result.why.c_str(), e.time.c_str(), e.rank, e.local_rank, config.node_rank,
                 e.signal ? "signal     " : "exit code  ",
                 e.signal ? reason.c_str() : std::to_string(e.exit_code).c_str(), error.c_str(), e.pid, attempt + 1,
                 config.max_restarts, config.command[0].c_str());
    return e.shell_code();
  }
}
