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
#include <functional>
#include <string>

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

}  // namespace dpt::dist
