#pragma once
// Where this process sits in the job: rank, world size, local rank and the rendezvous address.
// Three launch conventions are understood, in this order of precedence:
//   1. torchrun / dpt-run: RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT
//   2. Slurm (srun):       SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_NTASKS_PER_NODE or
//                          SLURM_TASKS_PER_NODE; master from MASTER_ADDR, else the first host of
//                          SLURM_STEP_NODELIST/SLURM_JOB_NODELIST, else SLURM_LAUNCH_NODE_IPADDR
//   3. Open MPI (mpirun):  OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE, OMPI_COMM_WORLD_LOCAL_RANK,
//                          OMPI_COMM_WORLD_LOCAL_SIZE; master from MASTER_ADDR
// With none of them set, the process is a world of one. Inconsistent values (a rank outside the world,
// a half-set convention, a non-number) are errors naming the variable and its value.
//
// The job id keeps two jobs given one rendezvous port apart (the store refuses a rank of another job).
// It is the first of DPT_JOB_ID (dpt-run sets it), TORCHELASTIC_RUN_ID (torchrun), SLURM_JOB_ID plus
// SLURM_STEP_ID (srun), PMIX_NAMESPACE or OMPI_MCA_ess_base_jobid (mpirun). Without any, it is
// "world<N>" for a world of N ranks: jobs of different sizes still never mix, but two jobs of the same
// size started by hand on one port cannot be told apart; give each its own MASTER_PORT or DPT_JOB_ID.
//
// dpt-run also hands its workers a few things of its own: rank 0 the rendezvous socket it bound
// (DPT_STORE_FD), and every worker a file for its error (DPT_ERROR_FILE, see report_error_to_launcher)
// and one for its heartbeat (DPT_HEARTBEAT_FILE, see Heartbeat).
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

namespace dpt::dist {

inline constexpr int kDefaultMasterPort = 29500;

struct DistEnv {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  int node_rank = 0;  // GROUP_RANK / SLURM_NODEID; informational
  std::string master_addr = "127.0.0.1";
  int master_port = kDefaultMasterPort;
  int restart_count = 0;        // DPT_RESTART_COUNT from dpt-run: which attempt of the group this is
  std::string source = "none";  // "torchrun", "slurm", "openmpi" or "none"
  std::string job_id;           // see above
  std::string job_id_source;    // the variable it came from, or "default"
  int store_fd = -1;            // DPT_STORE_FD: the listening socket dpt-run bound for rank 0's store
  std::string error_file;       // DPT_ERROR_FILE
  std::string heartbeat_file;   // DPT_HEARTBEAT_FILE

  std::string describe() const;  // "rank 1/4 (local 1/2) master 10.0.0.1:29500 via torchrun"
};

// Reads the process environment.
DistEnv read_dist_env();

// Same, from any variable lookup (returns nullptr for unset): lets tests supply their own environment.
using EnvLookup = std::function<const char*(const char* name)>;
DistEnv parse_dist_env(const EnvLookup& lookup);

// First host of a Slurm hostlist: "node[03-05,7],gpu1" -> "node03"; "a,b" -> "a".
std::string first_slurm_host(const std::string& hostlist);

// Tasks on node `node_id` from SLURM_TASKS_PER_NODE syntax: "2(x3),1" -> 2 for nodes 0..2, 1 for node 3.
int slurm_tasks_on_node(const std::string& tasks_per_node, int node_id);

// A failure as a worker reports it to dpt-run: when it happened (wall clock, ns since the epoch) and
// the error message. dpt-run compares the reports of its workers to find the root cause.
struct ErrorReport {
  int64_t time_ns = 0;
  std::string message;
};

// Writes `message` and the time now to DPT_ERROR_FILE, if the launcher set one (else does nothing).
// Call it where the program catches the error that ends it.
void report_error_to_launcher(const std::string& message);
// Reads a report written by report_error_to_launcher; nullopt when the file is missing or unreadable.
std::optional<ErrorReport> read_error_report(const std::string& path);

// Touches `path` every kHeartbeatInterval from a thread of its own, for as long as it lives, so that
// dpt-run can name a worker that stopped (SIGSTOP, a frozen machine, I/O that never returns) instead
// of only seeing its peers time out. The file holds the process id.
class Heartbeat {
 public:
  static constexpr std::chrono::milliseconds kInterval{1000};

  explicit Heartbeat(std::string path);
  ~Heartbeat();
  Heartbeat(const Heartbeat&) = delete;
  Heartbeat& operator=(const Heartbeat&) = delete;

 private:
  int fd_ = -1;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace dpt::dist
