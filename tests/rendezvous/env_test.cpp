// Launch-environment parsing for the three conventions (torchrun, Slurm, Open MPI).
#include "rendezvous/env.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>

#include "core/error.h"

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

// dpt-run sets the same variables plus its own DPT_MAX_RESTARTS: the run's banner names the real launcher.
TEST(DistEnv, TheVariablesOfDptRunAreNamedForIt) {
  auto e = parse({{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "1"}, {"DPT_MAX_RESTARTS", "0"}});
  EXPECT_EQ(e.source, "dpt-run");
  EXPECT_EQ(e.rank, 1);
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

TEST(DistEnv, TheJobIdComesFromTheLauncherElseFromTheWorldSize) {
  std::map<std::string, std::string> two = {{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "1"}};
  auto with = [&](std::map<std::string, std::string> extra) {
    extra.insert(two.begin(), two.end());
    return parse(extra);
  };
  // No launcher id: jobs of different sizes still differ.
  EXPECT_EQ(with({}).job_id, "world2");
  EXPECT_EQ(with({}).job_id_source, "default");
  EXPECT_EQ(with({{"SLURM_JOB_ID", "77"}, {"SLURM_STEP_ID", "3"}}).job_id, "slurm-77.3");
  EXPECT_EQ(with({{"PMIX_NAMESPACE", "prterun-x-1@1"}}).job_id, "mpi-prterun-x-1@1");
  EXPECT_EQ(with({{"TORCHELASTIC_RUN_ID", "abc"}, {"SLURM_JOB_ID", "77"}}).job_id, "abc");
  auto dpt = with({{"DPT_JOB_ID", "run-1"}, {"TORCHELASTIC_RUN_ID", "abc"}});
  EXPECT_EQ(dpt.job_id, "run-1");
  EXPECT_EQ(dpt.job_id_source, "DPT_JOB_ID");
}

TEST(DistEnv, WhatDptRunHandsItsWorkers) {
  auto e = parse({{"RANK", "0"},
                  {"WORLD_SIZE", "2"},
                  {"LOCAL_RANK", "0"},
                  {"DPT_STORE_FD", "5"},
                  {"DPT_ERROR_FILE", "/tmp/r/rank0.error"},
                  {"DPT_HEARTBEAT_FILE", "/tmp/r/rank0.heartbeat"}});
  EXPECT_EQ(e.store_fd, 5);
  EXPECT_EQ(e.error_file, "/tmp/r/rank0.error");
  EXPECT_EQ(e.heartbeat_file, "/tmp/r/rank0.heartbeat");
  EXPECT_EQ(parse({}).store_fd, -1);
  EXPECT_NE(error_of({{"DPT_STORE_FD", "five"}}).find("DPT_STORE_FD must be an integer, found 'five'"),
            std::string::npos);
  EXPECT_NE(error_of({{"DPT_STORE_FD", "-3"}}).find("DPT_STORE_FD must be a file descriptor, found -3"),
            std::string::npos);
}

TEST(DistEnv, AnErrorReportReachesTheLauncherWithItsTime) {
  std::string path = ::testing::TempDir() + "dpt_error_report_" + std::to_string(::getpid());
  ::setenv("DPT_ERROR_FILE", path.c_str(), 1);
  auto before = std::chrono::system_clock::now().time_since_epoch();
  report_error_to_launcher("cannot write /x: No space left on device\nsecond line");
  ::unsetenv("DPT_ERROR_FILE");
  auto report = read_error_report(path);
  std::remove(path.c_str());
  ASSERT_TRUE(report.has_value());
  EXPECT_EQ(report->message, "cannot write /x: No space left on device\nsecond line");
  EXPECT_GE(report->time_ns, std::chrono::duration_cast<std::chrono::nanoseconds>(before).count());
  EXPECT_FALSE(read_error_report(path).has_value());
}

}  // namespace
}  // namespace dpt::dist
