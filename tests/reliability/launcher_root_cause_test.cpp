// Whom dpt-run names as the root cause of a failed group. The first worker to exit is often not it:
// a rank that hits its own error (here ENOSPC, from a checkpoint written to /dev/full) closes its
// connections while it unwinds, and the peer that loses it can exit first. A rank that is stopped
// (SIGSTOP) never exits at all, and its peers only time out. The worker is workers/fault_worker.cpp.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "processes.h"

namespace {

using dpt::reliability::Child;
using dpt::reliability::Finished;
using dpt::reliability::kBin;
using dpt::reliability::ScratchDir;


const std::string kWorker = kBin + "dpt_test_fault_worker";
constexpr double kLimit = 90;  // seconds: only catches hangs

Finished run_job(const ScratchDir& dir, std::vector<std::string> launcher, const std::vector<std::string>& worker) {
  std::vector<std::string> argv = {kBin + "dpt-run", "--standalone"};
  argv.insert(argv.end(), launcher.begin(), launcher.end());
  argv.push_back("--");
  argv.insert(argv.end(), worker.begin(), worker.end());
  Child job(argv, dir.file("job.log"));
  return job.wait(kLimit);
}

TEST(LauncherRootCause, ARanksOwnErrorIsTheRootCauseEvenWhenThePeerThatLostItExitsFirst) {
  ScratchDir dir;
  // Rank 0's disk fills up at step 3; it takes 3 s to exit, rank 1 leaves as soon as it loses rank 0.
  Finished f = run_job(dir, {"--nproc-per-node", "2", "--grace-period", "10"},
                       {kWorker, "--timeout-ms", "20000", "--steps", "400", "--step-ms", "10", "--die-rank", "0",
                        "--die-step", "3", "--die-how", "disk-full", "--exit-delay-ms", "3000"});
  ASSERT_FALSE(f.hung) << f.output;
  EXPECT_EQ(f.exit_code, 1) << f.output;
  EXPECT_CONTAINS(f.output, "[1]: error: ");  // rank 1 did fail, on the lost connection
  EXPECT_CONTAINS(f.output, "root cause: rank 0 (its own error came first)");
  EXPECT_CONTAINS(f.output, "rank       : 0 (local rank 0, node 0)");
  EXPECT_CONTAINS(f.output, "error      : cannot write checkpoint /dev/full: No space left on device");
}

TEST(LauncherRootCause, ARankStoppedBySigstopIsNamedAtOnceAndAsTheRootCause) {
  ScratchDir dir;
  Finished f = run_job(dir, {"--nproc-per-node", "3", "--grace-period", "2"},
                       {kWorker, "--timeout-ms", "5000", "--steps", "400", "--step-ms", "10", "--die-rank", "2",
                        "--die-step", "3", "--die-how", "stop"});
  ASSERT_FALSE(f.hung) << f.output;
  EXPECT_NE(f.exit_code, 0) << f.output;
  EXPECT_CONTAINS(f.output, "dpt-run: rank 2 (pid ");
  EXPECT_CONTAINS(f.output, "has stopped making progress: stopped by SIGSTOP");
  EXPECT_CONTAINS(f.output, "root cause: rank 2 (it stopped making progress (stopped by SIGSTOP)");
  EXPECT_CONTAINS(f.output, "rank       : 2 (local rank 2, node 0)");
  // Whatever rank 2 said once dpt-run let it go on is no cause: the report shows no error for it.
  EXPECT_EQ(dpt::reliability::count(f.output, "error      : "), 0) << f.output;
}

// The stopped process is not dpt-run's child but runs under a shell: only its heartbeat tells.
TEST(LauncherRootCause, AStalledRankBehindAWrapperIsNamedFromItsHeartbeat) {
  ScratchDir dir;
  Finished f =
      run_job(dir, {"--nproc-per-node", "2", "--grace-period", "2", "--heartbeat-timeout", "3"},
              {"/bin/sh", "-c", "\"$@\"; status=$?; exit $status", "sh", kWorker, "--timeout-ms", "15000", "--steps",
               "400", "--step-ms", "10", "--die-rank", "1", "--die-step", "3", "--die-how", "stop"});
  ASSERT_FALSE(f.hung) << f.output;
  EXPECT_NE(f.exit_code, 0) << f.output;
  EXPECT_CONTAINS(f.output, "dpt-run: rank 1 (pid ");
  EXPECT_CONTAINS(f.output, "has stopped making progress: no heartbeat for ");
  EXPECT_CONTAINS(f.output, "root cause: rank 1 (it stopped making progress (no heartbeat for ");
  EXPECT_CONTAINS(f.output, "is in state T (stopped)");
  EXPECT_EQ(dpt::reliability::count(f.output, "error      : "), 0) << f.output;
}

}  // namespace
