// Faults of a running data-parallel job on the CPU (Gloo): a rank killed with SIGKILL mid-training,
// the store's host (rank 0) dying, a rank that never joins, a rank that stalls. The worker
// (workers/fault_worker.cpp) trains a small MLP with DDP and dies on request.
//
// Two launch shapes: one dpt-run for all ranks (it sees the death and stops the others), and one
// dpt-run per rank, as on separate nodes, where each survivor must find out by itself through its
// collectives or the store, and leave with an error naming the operation and the lost peer within the
// configured timeout (3 s here; the bounds below only catch hangs).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "processes.h"

namespace {

using dpt::reliability::Child;
using dpt::reliability::count;
using dpt::reliability::Finished;
using dpt::reliability::kBin;
using dpt::reliability::ScratchDir;


const std::string kWorker = kBin + "dpt_test_fault_worker";
// Concatenation by appends (GCC 12 misreports "literal" + std::string temporaries, -Wrestrict).
std::string cat(std::initializer_list<std::string> parts) {
  std::string out;
  for (const auto& p : parts) out += p;
  return out;
}

constexpr double kHangLimit = 45;  // seconds: far above every timeout the scenarios configure

std::vector<std::string> worker_args(std::vector<std::string> extra) {
  std::vector<std::string> args = {kWorker, "--timeout-ms", "3000"};
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

// One dpt-run per rank (each a "node" of one process) on localhost; `ranks` lists the ranks started,
// rank 0 first. Node 0's dpt-run binds a free port and prints it; the others are given that port.
std::vector<std::unique_ptr<Child>> start_per_rank(const ScratchDir& dir, int world, const std::vector<int>& ranks,
                                                   const std::vector<std::string>& extra) {
  std::vector<std::unique_ptr<Child>> children;
  int port = -1;
  for (int r : ranks) {
    std::vector<std::string> argv = {kBin + "dpt-run",
                                     "--nnodes",
                                     std::to_string(world),
                                     "--node-rank",
                                     std::to_string(r),
                                     "--nproc-per-node",
                                     "1",
                                     "--master-addr",
                                     "127.0.0.1",
                                     "--master-port",
                                     std::to_string(r == 0 ? 0 : port),
                                     "--rdzv-id",
                                     "rank-faults",
                                     "--grace-period",
                                     "1",
                                     "--"};
    for (const auto& a : worker_args(extra)) argv.push_back(a);
    children.push_back(std::make_unique<Child>(argv, dir.file(cat({"rank", std::to_string(r), ".log"}))));
    if (r == 0) port = dpt::reliability::rendezvous_port(*children.back(), kHangLimit);
  }
  return children;
}

std::vector<Finished> launch_per_rank(const ScratchDir& dir, int world, const std::vector<int>& ranks,
                                      const std::vector<std::string>& extra) {
  auto children = start_per_rank(dir, world, ranks, extra);
  std::vector<Finished> out;
  for (auto& c : children) out.push_back(c->wait(kHangLimit));
  return out;
}

TEST(RankFaults, SigkillMidTrainingUnderOneLauncherStopsTheGroupAndExitsNonZero) {
  ScratchDir dir;
  std::vector<std::string> argv = {kBin + "dpt-run", "--standalone", "--nproc-per-node", "3", "--grace-period", "1", "--"};
  for (const auto& a : worker_args({"--steps", "400", "--step-ms", "20", "--die-rank", "1", "--die-step", "5"}))
    argv.push_back(a);
  Child run(argv, dir.file("run.log"));
  Finished f = run.wait(kHangLimit);
  ASSERT_FALSE(f.hung) << f.output;
  EXPECT_EQ(f.exit_code, 128 + 9) << f.output;
  EXPECT_CONTAINS(f.output, "[1]: dying (kill)");
  EXPECT_CONTAINS(f.output, "rank       : 1 (local rank 1, node 0)");
  EXPECT_CONTAINS(f.output, "signal     : 9 (Killed)");
  EXPECT_EQ(count(f.output, "finished"), 0) << f.output;
}

TEST(RankFaults, SigkillMidTrainingOnItsOwnNodeFailsEverySurvivorNamingTheOperationAndThePeer) {
  ScratchDir dir;
  auto results = launch_per_rank(dir, 3, {0, 1, 2},
                                 {"--steps", "400", "--step-ms", "20", "--die-rank", "1", "--die-step", "5"});
  ASSERT_EQ(results.size(), 3u);
  for (const auto& f : results) ASSERT_FALSE(f.hung) << f.output;
  EXPECT_EQ(results[1].exit_code, 128 + 9) << results[1].output;
  int naming_the_dead_rank = 0;
  for (int r : {0, 2}) {
    const auto& out = results[static_cast<size_t>(r)].output;
    EXPECT_EQ(results[static_cast<size_t>(r)].exit_code, 1) << out;
    EXPECT_CONTAINS(out, cat({"[", std::to_string(r), "]: error: Gloo allreduce #"}));
    EXPECT_EQ(count(out, "finished"), 0) << out;
    naming_the_dead_rank += count(out, "rank 1 has exited or been killed") > 0 ? 1 : 0;
  }
  // The first survivor to notice names rank 1; the second usually does too (directly, or through the
  // first one's report in the store), unless the first one, hosting the store, was already gone.
  EXPECT_GE(naming_the_dead_rank, 1) << results[0].output << results[2].output;
}

TEST(RankFaults, StoreHostKilledMidTrainingFailsTheOthersNamingRank0) {
  ScratchDir dir;
  auto results = launch_per_rank(dir, 3, {0, 1, 2},
                                 {"--steps", "400", "--step-ms", "20", "--die-rank", "0", "--die-step", "5"});
  for (const auto& f : results) ASSERT_FALSE(f.hung) << f.output;
  EXPECT_EQ(results[0].exit_code, 128 + 9) << results[0].output;
  for (int r : {1, 2}) {
    const auto& out = results[static_cast<size_t>(r)].output;
    EXPECT_EQ(results[static_cast<size_t>(r)].exit_code, 1) << out;
    EXPECT_CONTAINS(out, "error: Gloo allreduce #");
    // The peer named may be the other survivor (it failed first and closed its connections), but then
    // the unreachable store names its host.
    EXPECT_TRUE(out.find("rank 0 has exited or been killed") != std::string::npos ||
                out.find("rank 0, which hosts it, has exited or been killed") != std::string::npos)
        << out;
  }
}

TEST(RankFaults, StoreHostKilledDuringRendezvousFailsTheOthersFast) {
  ScratchDir dir;
  auto results = launch_per_rank(dir, 3, {0, 1, 2}, {"--die-rank", "0", "--die-before-join"});
  for (const auto& f : results) ASSERT_FALSE(f.hung) << f.output;
  EXPECT_EQ(results[0].exit_code, 128 + 9) << results[0].output;
  for (int r : {1, 2}) {
    const auto& f = results[static_cast<size_t>(r)];
    EXPECT_EQ(f.exit_code, 1) << f.output;
    EXPECT_CONTAINS(f.output, "rank 0, which hosts the store");
    EXPECT_LT(f.seconds, 20) << f.output;  // it fails on the closed connection, not on a timeout
  }
}

TEST(RankFaults, ARankThatNeverJoinsFailsTheOthersWithinTheTimeoutNamingIt) {
  ScratchDir dir;
  auto results = launch_per_rank(dir, 3, {0, 1}, {"--steps", "3"});  // rank 2's node never starts
  for (const auto& f : results) {
    ASSERT_FALSE(f.hung) << f.output;
    EXPECT_EQ(f.exit_code, 1) << f.output;
    EXPECT_CONTAINS(f.output, "barrier 'init_process_group'");
    EXPECT_CONTAINS(f.output, "1 of 3 ranks never arrived: 2");
  }
}

TEST(RankFaults, AStalledRankMakesTheOthersTimeOutNamingTheOperation) {
  ScratchDir dir;
  auto children =
      start_per_rank(dir, 3, {0, 1, 2},
                     {"--steps", "400", "--step-ms", "20", "--die-rank", "2", "--die-step", "3", "--die-how", "hang"});
  for (int r : {0, 1}) {
    Finished f = children[static_cast<size_t>(r)]->wait(kHangLimit);
    ASSERT_FALSE(f.hung) << f.output;
    EXPECT_EQ(f.exit_code, 1) << f.output;
    EXPECT_CONTAINS(f.output, "error: Gloo allreduce #");
    EXPECT_CONTAINS(f.output, "(timeout 3000 ms)");
  }
  // The stalled rank lives until its launcher is told to stop: SIGTERM reaches it through dpt-run.
  ASSERT_TRUE(children[2]->wait_for_output("dying (hang)", kHangLimit));
  children[2]->signal(SIGTERM);
  Finished stalled = children[2]->wait(kHangLimit);
  EXPECT_FALSE(stalled.hung) << stalled.output;
  EXPECT_EQ(stalled.exit_code, 128 + SIGTERM) << stalled.output;
}

TEST(RankFaults, AfterASigkillMaxRestartsRunsTheGroupAgainToTheSameResultAsAnUninterruptedRun) {
  ScratchDir dir;
  auto launch = [&](const std::string& name, std::vector<std::string> extra) {
    std::vector<std::string> argv = {kBin + "dpt-run", "--standalone", "--nproc-per-node", "2", "--max-restarts", "1",
                                     "--grace-period", "1", "--"};
    for (const auto& a : worker_args(extra)) argv.push_back(a);
    Child c(argv, dir.file(name));
    return c.wait(kHangLimit);
  };
  Finished clean = launch("clean.log", {"--steps", "8"});
  Finished killed = launch("killed.log", {"--steps", "8", "--die-rank", "1", "--die-step", "4"});
  ASSERT_EQ(clean.exit_code, 0) << clean.output;
  ASSERT_EQ(killed.exit_code, 0) << killed.output;
  EXPECT_CONTAINS(killed.output, "rank 1 failed (signal 9); restarting the worker group (restart 1 of 1)");
  // Each run prints "[r]: finished; checksum X" on both ranks; the restarted job ends where the clean one did.
  auto checksum = [](const std::string& out, const std::string& rank) {
    auto pos = out.find(cat({"[", rank, "]: finished; checksum "}));
    return pos == std::string::npos ? std::string("missing") : out.substr(pos, out.find('\n', pos) - pos);
  };
  for (std::string r : {"0", "1"}) {
    EXPECT_NE(checksum(clean.output, r), "missing") << clean.output;
    EXPECT_EQ(checksum(killed.output, r), checksum(clean.output, r)) << killed.output;
  }
}

}  // namespace
