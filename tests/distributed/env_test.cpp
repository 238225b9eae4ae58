// Launch-environment parsing for the three conventions (torchrun, Slurm, Open MPI).
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "core/error.h"
#include "distributed/env.h"

namespace dpt::dist {
namespace {

DistEnv parse(const std::map<std::string, std::string>& vars) {
  return parse_dist_env([&](const char* name) -> const char* {
    auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  });
}

std::string error_of(const std::map<std::string, std::string>& vars) {
  try {
    parse(vars);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(DistEnv, NoLauncherIsAWorldOfOne) {
  auto e = parse({});
  EXPECT_EQ(e.rank, 0);
  EXPECT_EQ(e.world_size, 1);
  EXPECT_EQ(e.local_rank, 0);
  EXPECT_EQ(e.master_addr, "127.0.0.1");
  EXPECT_EQ(e.master_port, kDefaultMasterPort);
  EXPECT_EQ(e.source, "none");
}

TEST(DistEnv, TorchrunVariables) {
  auto e = parse({{"RANK", "5"}, {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "1"}, {"LOCAL_WORLD_SIZE", "4"},
                  {"MASTER_ADDR", "10.1.2.3"}, {"MASTER_PORT", "1234"}, {"DPT_RESTART_COUNT", "2"},
                  {"SLURM_PROCID", "0"}});  // torchrun wins over Slurm
  EXPECT_EQ(e.source, "torchrun");
  EXPECT_EQ(e.rank, 5);
  EXPECT_EQ(e.world_size, 8);
  EXPECT_EQ(e.local_rank, 1);
  EXPECT_EQ(e.local_world_size, 4);
  EXPECT_EQ(e.node_rank, 1);
  EXPECT_EQ(e.master_addr, "10.1.2.3");
  EXPECT_EQ(e.master_port, 1234);
  EXPECT_EQ(e.restart_count, 2);
}

TEST(DistEnv, TorchrunErrorsNameTheVariable) {
  EXPECT_NE(error_of({{"RANK", "1"}}).find("WORLD_SIZE is not set"), std::string::npos);
  EXPECT_NE(error_of({{"RANK", "x1"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "0"}}).find("RANK must be an integer, found 'x1'"),
            std::string::npos);
  EXPECT_NE(error_of({{"RANK", "2"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "0"}}).find("rank must be in [0, 2), found 2"),
            std::string::npos);
  EXPECT_NE(error_of({{"RANK", "1"}, {"WORLD_SIZE", "2"}}).find("LOCAL_RANK is not set"), std::string::npos);
  EXPECT_NE(error_of({{"RANK", "1"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "1"}, {"LOCAL_WORLD_SIZE", "2"}})
                .find("MASTER_ADDR is not set"),
            std::string::npos);
  EXPECT_NE(error_of({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "0"}, {"MASTER_PORT", "70000"}})
                .find("MASTER_PORT must be in [1, 65535], found 70000"),
            std::string::npos);
}

TEST(DistEnv, SlurmVariables) {
  auto e = parse({{"SLURM_PROCID", "3"}, {"SLURM_NTASKS", "4"}, {"SLURM_LOCALID", "1"}, {"SLURM_NODEID", "1"},
                  {"SLURM_TASKS_PER_NODE", "2(x2)"}, {"SLURM_JOB_NODELIST", "gpu[07-08]"}});
  EXPECT_EQ(e.source, "slurm");
  EXPECT_EQ(e.rank, 3);
  EXPECT_EQ(e.world_size, 4);
  EXPECT_EQ(e.local_rank, 1);
  EXPECT_EQ(e.local_world_size, 2);
  EXPECT_EQ(e.master_addr, "gpu07");
  EXPECT_EQ(e.master_port, kDefaultMasterPort);

  auto m = parse({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_LOCALID", "0"},
                  {"SLURM_NTASKS_PER_NODE", "1"}, {"SLURM_LAUNCH_NODE_IPADDR", "192.168.0.9"}});
  EXPECT_EQ(m.local_world_size, 1);
  EXPECT_EQ(m.master_addr, "192.168.0.9");
  auto explicit_master = parse({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_LOCALID", "0"},
                                {"SLURM_JOB_NODELIST", "a,b"}, {"MASTER_ADDR", "head"}});
  EXPECT_EQ(explicit_master.master_addr, "head");
}

TEST(DistEnv, SlurmInconsistentValuesAreErrors) {
  EXPECT_NE(error_of({{"SLURM_PROCID", "0"}}).find("SLURM_NTASKS is not set"), std::string::npos);
  EXPECT_NE(error_of({{"SLURM_PROCID", "4"}, {"SLURM_NTASKS", "4"}, {"SLURM_LOCALID", "0"}})
                .find("rank must be in [0, 4), found 4"),
            std::string::npos);
  EXPECT_NE(error_of({{"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "4"}, {"SLURM_LOCALID", "3"},
                      {"SLURM_NTASKS_PER_NODE", "2"}, {"MASTER_ADDR", "h"}})
                .find("local rank must be in [0, local world size 2), found 3"),
            std::string::npos);
}

TEST(DistEnv, SlurmHostlistsAndTaskCounts) {
  EXPECT_EQ(first_slurm_host("node[03-05,7],gpu1"), "node03");
  EXPECT_EQ(first_slurm_host("alpha,beta"), "alpha");
  EXPECT_EQ(first_slurm_host("single"), "single");
  EXPECT_EQ(slurm_tasks_on_node("2(x3),1", 0), 2);
  EXPECT_EQ(slurm_tasks_on_node("2(x3),1", 2), 2);
  EXPECT_EQ(slurm_tasks_on_node("2(x3),1", 3), 1);
  EXPECT_THROW(slurm_tasks_on_node("2(x3),1", 4), Error);
}

TEST(DistEnv, OpenMpiVariables) {
  auto e = parse({{"OMPI_COMM_WORLD_RANK", "2"}, {"OMPI_COMM_WORLD_SIZE", "3"}, {"OMPI_COMM_WORLD_LOCAL_RANK", "2"},
                  {"OMPI_COMM_WORLD_LOCAL_SIZE", "3"}, {"MASTER_PORT", "4000"}});
  EXPECT_EQ(e.source, "openmpi");
  EXPECT_EQ(e.rank, 2);
  EXPECT_EQ(e.world_size, 3);
  EXPECT_EQ(e.local_rank, 2);
  EXPECT_EQ(e.local_world_size, 3);
  EXPECT_EQ(e.master_addr, "127.0.0.1");  // one node: loopback is right
  EXPECT_EQ(e.master_port, 4000);
  // Several nodes and no MASTER_ADDR: there is no way to know rank 0's host.
  EXPECT_NE(error_of({{"OMPI_COMM_WORLD_RANK", "2"}, {"OMPI_COMM_WORLD_SIZE", "4"},
                      {"OMPI_COMM_WORLD_LOCAL_RANK", "0"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}})
                .find("MASTER_ADDR is not set"),
            std::string::npos);
  EXPECT_NE(error_of({{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "2"}}).find("OMPI_COMM_WORLD_LOCAL_RANK"),
            std::string::npos);
}

}  // namespace
}  // namespace dpt::dist
