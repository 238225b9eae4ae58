#pragma once
// dpt-run's worker supervision: start one process per local rank with the torchrun environment,
// prefix their output lines with the rank, forward signals, and on the first failure stop the others
// (SIGTERM, a grace period, then SIGKILL). While they run, it watches that each still makes progress
// (a worker stopped by a signal, or whose heartbeat file has gone stale, is named at once), and when
// the group fails it names the root cause from the workers' error reports (root_cause.h).
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
  double heartbeat_timeout_s = 30.0;  // a worker whose heartbeat is older is named as stalled
  std::string job_id;                 // DPT_JOB_ID for every worker ("": they derive their own)
  int store_fd = -1;                  // node 0: the bound rendezvous socket, handed to rank 0 (DPT_STORE_FD)
  std::string report_dir;             // where workers write their error reports and heartbeats
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
  WorkerExit root_cause;  // the worker that caused the failure (when !success and no user signal)
  std::string why;        // why it is the root cause
  std::string error;      // the error it reported, if it did
  int user_signal = 0;    // a signal we received and forwarded (SIGINT, SIGTERM, ...), else 0
};

// Runs one attempt of the local worker group to completion.
GroupResult run_worker_group(const LaunchConfig& config, int attempt);

// Installs the signal handlers (call once, before run_worker_group).
void install_signal_handlers();

}  // namespace dpt::run
