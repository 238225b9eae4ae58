#pragma once
// dpt-run's worker supervision: start one process per local rank with the torchrun environment,
// prefix their output lines with the rank, forward signals, and on the first failure stop the others
// (SIGTERM, a grace period, then SIGKILL).
#include <string>
#include <vector>

namespace dpt::run {

struct LaunchConfig {
  int nproc_per_node = 1;
  int nnodes = 1;
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  int max_restarts = 0;
  double grace_period_s = 5.0;  // between SIGTERM and SIGKILL when stopping workers
  std::string job_id;           // DPT_JOB_ID for every worker ("": they derive their own)
  int store_fd = -1;            // node 0: the bound rendezvous socket, handed to rank 0 (DPT_STORE_FD)
  std::vector<std::string> command;  // program and its arguments
};

// Why a worker ended.
struct WorkerExit {
  int rank = -1;
  int local_rank = -1;
  int pid = 0;
  int exit_code = 0;  // valid when signal == 0
  int signal = 0;     // the signal that killed it, or 0
  std::string time;   // local time of the exit, ISO 8601
  int shell_code() const { return signal != 0 ? 128 + signal : exit_code; }
};

struct GroupResult {
  bool success = false;
  WorkerExit root_cause;  // the first worker to fail (when !success and no user signal)
  int user_signal = 0;    // a signal we received and forwarded (SIGINT, SIGTERM, ...), else 0
};

// Runs one attempt of the local worker group to completion.
GroupResult run_worker_group(const LaunchConfig& config, int attempt);

// Installs the signal handlers (call once, before run_worker_group).
void install_signal_handlers();

}  // namespace dpt::run
