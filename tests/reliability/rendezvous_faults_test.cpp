// The rendezvous of real jobs under dpt-run, against what happens on shared machines: a port scan of a
// running job's master port, a second job given the same port, a port that is taken, and a stop
// request while rank 0 still waits for peers that never come. The worker is workers/fault_worker.cpp
// (DDP on Gloo); the trainer is dpt-train.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/socket.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "processes.h"
#include "rendezvous/socket.h"
#include "rendezvous/store.h"
#include "rendezvous/store_protocol.h"
#include "rendezvous/tcp_store_server.h"

namespace {

using dpt::reliability::Child;
using dpt::reliability::count;
using dpt::reliability::Finished;
using dpt::reliability::kBin;
using dpt::reliability::rank_pid;
using dpt::reliability::rendezvous_port;
using dpt::reliability::ScratchDir;
namespace net = dpt::dist::net;


const std::string kWorker = kBin + "dpt_test_fault_worker";
constexpr double kLimit = 90;  // seconds: only catches hangs

// dpt-run --standalone over the fault worker, training until `stop_file` exists.
std::vector<std::string> job_until(const std::string& stop_file, int nproc) {
  return {kBin + "dpt-run",
          "--standalone",
          "--nproc-per-node",
          std::to_string(nproc),
          "--grace-period",
          "1",
          "--",
          kWorker,
          "--timeout-ms",
          "20000",
          "--step-ms",
          "10",
          "--until-file",
          stop_file};
}

size_t descriptors_of(pid_t pid) {
  size_t n = 0;
  std::error_code ec;
  for (std::filesystem::directory_iterator it("/proc/" + std::to_string(pid) + "/fd", ec), end; !ec && it != end;
       it.increment(ec))
    ++n;
  return n;
}

bool eventually(const std::function<bool()>& condition, double limit_s = kLimit) {
  auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(limit_s);
  while (std::chrono::steady_clock::now() < end) {
    if (condition()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return condition();
}

int connect_to(int port) { return net::connect_tcp("127.0.0.1", port, net::deadline_after(std::chrono::seconds(30))); }

void touch(const std::string& path) { std::ofstream(path) << "stop\n"; }

TEST(Rendezvous, APortScanOfARunningJobLeavesRank0WithBoundedDescriptorsAndTheJobFinishes) {
  ScratchDir dir;
  const std::string stop = dir.file("stop");
  Child job(job_until(stop, 2), dir.file("job.log"));
  const int port = rendezvous_port(job, kLimit);
  ASSERT_GT(port, 0) << job.output();
  ASSERT_TRUE(job.wait_for_output("[0]: step 2", kLimit)) << job.output();
  const pid_t rank0 = rank_pid(job.pid(), 0);
  ASSERT_NE(rank0, 0);
  const size_t before = descriptors_of(rank0);

  // A health check or port scanner: plain connects, closed at once, more than a process may hold.
  for (int i = 0; i < 1100; ++i) net::close_fd(connect_to(port));
  // Scanners that stay, some of them sending garbage and absurd lengths.
  std::vector<int> held;
  for (int i = 0; i < 200; ++i) held.push_back(connect_to(port));
  std::string absurd;
  dpt::dist::store_wire::put_u32(absurd, dpt::dist::store_wire::kMagic);
  dpt::dist::store_wire::put_u32(absurd, dpt::dist::store_wire::kVersion);
  dpt::dist::store_wire::put_u32(absurd, 0xFFFFFFF0u);
  for (int i = 0; i < 20; ++i) {
    std::string bytes = i % 2 ? absurd : std::string("\x16\x03\x01 not a store request");
    [[maybe_unused]] auto k = ::send(held[static_cast<size_t>(i)], bytes.data(), bytes.size(), MSG_NOSIGNAL);
  }
  // Rank 0 holds at most the store's quota of strangers meanwhile (it held one per connection before).
  const size_t bound = before + dpt::dist::TcpStoreServer::kMaxStrangers + 8;
  EXPECT_TRUE(eventually([&] { return descriptors_of(rank0) <= bound; }))
      << descriptors_of(rank0) << " descriptors in rank 0, " << before << " before the scan";
  for (int fd : held) net::close_fd(fd);
  EXPECT_TRUE(eventually([&] { return descriptors_of(rank0) <= before + 4; }))
      << descriptors_of(rank0) << " descriptors in rank 0, " << before << " before the scan";

  touch(stop);
  Finished f = job.wait(kLimit);
  ASSERT_FALSE(f.hung) << f.output;
  EXPECT_EQ(f.exit_code, 0) << f.output;
  EXPECT_EQ(count(f.output, "finished; checksum"), 2) << f.output;
}

TEST(Rendezvous, ASecondJobGivenTheSamePortNeverJoinsTheFirst) {
  ScratchDir dir;
  const std::string stop = dir.file("stop");
  Child first(job_until(stop, 2), dir.file("first.log"));
  const int port = rendezvous_port(first, kLimit);
  ASSERT_GT(port, 0) << first.output();
  ASSERT_TRUE(first.wait_for_output("[1]: step 2", kLimit)) << first.output();

  // The second job's node 1: its rank (of a job of the same size) reaches the first job's store.
  Child joiner({kBin + "dpt-run", "--nnodes", "2", "--node-rank", "1", "--nproc-per-node", "1", "--master-addr",
                "127.0.0.1", "--master-port", std::to_string(port), "--grace-period", "1", "--", kWorker,
                "--timeout-ms", "20000", "--steps", "5"},
               dir.file("joiner.log"));
  Finished j = joiner.wait(kLimit);
  ASSERT_FALSE(j.hung) << j.output;
  EXPECT_EQ(j.exit_code, 1) << j.output;
  EXPECT_CONTAINS(j.output, "the store at 127.0.0.1:" + std::to_string(port) + " belongs to another job");

  // The second job's node 0 cannot host on the port: it says so before starting any worker.
  Child host({kBin + "dpt-run", "--nnodes", "2", "--node-rank", "0", "--nproc-per-node", "1", "--master-port",
              std::to_string(port), "--", kWorker, "--steps", "5"},
             dir.file("host.log"));
  Finished h = host.wait(kLimit);
  ASSERT_FALSE(h.hung) << h.output;
  EXPECT_EQ(h.exit_code, 1) << h.output;
  EXPECT_CONTAINS(h.output, "cannot listen on TCP port " + std::to_string(port) + ": Address already in use");
  EXPECT_EQ(count(h.output, "[0]: "), 0) << h.output;

  // The first job never noticed.
  touch(stop);
  Finished f = first.wait(kLimit);
  ASSERT_FALSE(f.hung) << f.output;
  EXPECT_EQ(f.exit_code, 0) << f.output;
  EXPECT_EQ(count(f.output, "finished; checksum"), 2) << f.output;
  EXPECT_EQ(count(f.output, "error"), 0) << f.output;
}

TEST(Rendezvous, TheStandalonePortIsHeldByTheLauncherFromTheMomentItIsChosen) {
  ScratchDir dir;
  Child job({kBin + "dpt-run", "--standalone", "--nproc-per-node", "1", "--", "/bin/sleep", "600"},
            dir.file("job.log"));
  const int port = rendezvous_port(job, kLimit);
  ASSERT_GT(port, 0) << job.output();
  // No worker here listens on it, yet nobody else can take it: it is dpt-run's until rank 0 serves on it.
  std::string error;
  try {
    net::close_fd(net::bind_tcp(port, true));
  } catch (const std::exception& e) {
    error = e.what();
  }
  EXPECT_CONTAINS(error, "Address already in use");
  job.signal(SIGTERM);
  EXPECT_FALSE(job.wait(kLimit).hung);
}

TEST(Rendezvous, Rank0WaitingForPeersThatNeverComeLeavesOnSigterm) {
  ScratchDir dir;
  // Rank 1 never joins: it only sleeps. The launcher would wait 120 s before killing rank 0, and rank 0's
  // rendezvous timeout is 600 s, so only rank 0 leaving by itself passes within the limit.
  Child job({kBin + "dpt-run",
             "--standalone",
             "--nproc-per-node",
             "2",
             "--grace-period",
             "120",
             "--rdzv-id",
             "waiting-job",
             "--",
             "/bin/sh",
             "-c",
             "if [ \"$RANK\" = 0 ]; then exec \"$0\" \"$@\"; fi; exec sleep 600",
             kBin + "dpt-train",
             "--config",
             DPT_SOURCE_DIR "/configs/mlp_synthetic.yaml",
             "--set",
             "training.device=cpu",
             "--set",
             "distributed.timeout_s=600",
             "--set",
             "checkpoint.dir=" + dir.file("run")},
            dir.file("job.log"));
  const int port = rendezvous_port(job, kLimit);
  ASSERT_GT(port, 0) << job.output();
  {
    // Watch the store until rank 0 waits in the first barrier.
    dpt::dist::TcpStoreOptions o;
    o.port = port;
    o.rank = 1;
    o.world_size = 2;
    o.job_id = "waiting-job";
    o.timeout = std::chrono::seconds(60);
    dpt::dist::TcpStore watcher(o);
    ASSERT_TRUE(watcher.wait_for({"attempt0/barrier/init_process_group/0/0"}, std::chrono::seconds(60)).empty())
        << job.output();
  }
  job.signal(SIGTERM);
  Finished f = job.wait(60);
  ASSERT_FALSE(f.hung) << f.output;
  EXPECT_EQ(f.exit_code, 128 + SIGTERM) << f.output;
  // Before training starts the trainer leaves at once on a stop signal (apps/train/stop_signal.h).
  EXPECT_CONTAINS(f.output, "[0]: dpt-train: SIGTERM before training started: exiting");
}

}  // namespace
