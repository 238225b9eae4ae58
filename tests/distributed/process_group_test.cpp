// Multi-process tests: the Gloo process group and dpt-run, with workers started through the built
// dpt-run. The worker program (workers/collectives_worker.cpp) checks every result against its closed
// form; these tests check exit codes, per-rank output and that failures end in bounded time.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "core/cuda_runtime.h"
#include "worker_command.h"

namespace {

const std::string kRun = DPT_BINARY_DIR "/bin/dpt-run";
const std::string kWorker = worker_command(DPT_BINARY_DIR "/bin/dpt_test_collectives_worker");

struct RunResult {
  int exit_code = -1;
  std::string output;  // stdout and stderr together
  double seconds = 0;
};

RunResult run(const std::string& args, const std::string& env = "") {
  std::string cmd = env + " " + kRun + " " + args + " 2>&1";
  auto start = std::chrono::steady_clock::now();
  FILE* p = ::popen(cmd.c_str(), "r");
  RunResult r;
  if (p == nullptr) return r;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) r.output.append(buf, n);
  int status = ::pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return r;
}

int count(const std::string& text, const std::string& part) {
  int c = 0;
  for (size_t pos = text.find(part); pos != std::string::npos; pos = text.find(part, pos + part.size())) ++c;
  return c;
}

// "[rank]: text", built by appends (GCC 12 misreports "literal" + std::string temporaries, -Wrestrict).
std::string line(const std::string& rank, const std::string& text) {
  std::string out = "[";
  out += rank;
  out += "]: ";
  out += text;
  return out;
}

#define EXPECT_CONTAINS(text, part) EXPECT_NE((text).find(part), std::string::npos) << (text)

class GlooCollectives : public ::testing::TestWithParam<int> {};

TEST_P(GlooCollectives, EveryCollectiveMatchesItsClosedForm) {
  int world = GetParam();
  auto r = run("--standalone --nproc-per-node " + std::to_string(world) + " -- " + kWorker + " collectives");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (int rank = 0; rank < world; ++rank) {
    std::string rank_text = std::to_string(rank);
    EXPECT_CONTAINS(r.output, line(rank_text, "collectives OK on rank " + rank_text + " of " + std::to_string(world)));
  }
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, GlooCollectives, ::testing::Values(1, 2, 3, 4));

TEST(GlooFailures, APeerThatLeavesMakesTheOthersFailNamingTheOperation) {
  auto r = run("--standalone --nproc-per-node 3 -- " + kWorker + " peer_exits");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(count(r.output, "expected error: Gloo allreduce #2"), 2) << r.output;
  EXPECT_LT(r.seconds, 30);
}

TEST(GlooFailures, AStalledPeerMakesTheOthersTimeOut) {
  auto r = run("--standalone --nproc-per-node 3 -- " + kWorker + " peer_stalls");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(count(r.output, "(timeout 1500 ms)"), 2) << r.output;
  EXPECT_CONTAINS(r.output, "[1]: peer left");
  EXPECT_LT(r.seconds, 30);
}

TEST(GlooFailures, AWorkerThatNeverJoinsFailsEveryOtherRankWithinTheTimeout) {
  auto r = run("--standalone --nproc-per-node 3 -- " + kWorker + " never_joins");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  // Ranks 0 and 1 both time out waiting for rank 2, at about the same moment. Whichever reports first
  // makes dpt-run stop the others, so the second report may be cut short: at least one, naming rank 2.
  EXPECT_GE(count(r.output, "1 of 3 ranks never arrived: 2"), 1) << r.output;
  EXPECT_EQ(count(r.output, "joined without the last rank"), 0) << r.output;
  EXPECT_LT(r.seconds, 30);
}

TEST(DebugCollectives, AMismatchNamesTheDivergentRankOnEveryRank) {
  auto r = run("--standalone --nproc-per-node 3 -- " + kWorker + " debug_mismatch");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(count(r.output, "collective mismatch at sequence number 2: rank 0 calls allreduce(sum) of 8 x float32 "
                            "but rank 1 calls broadcast(root 0) of 8 x float32"),
            3)
      << r.output;
}

// NCCL: the same closed forms and failure behaviour on two GPUs (skipped without them).
bool have_two_gpus() { return dpt::cuda::is_available() && dpt::cuda::device_count() >= 2; }

// Rank 0's "failed after X s": how long its failing collective took to raise, start-up left out. -1 when the
// line is missing.
double failed_after(const std::string& output) {
  const std::string mark = "[0]: failed after ";
  const size_t at = output.find(mark);
  return at == std::string::npos ? -1.0 : std::strtod(output.c_str() + at + mark.size(), nullptr);
}

// Starting CUDA and NCCL in a full parallel GPU suite (every core running a test, four GPUs) took over a
// minute; only a hang takes this long.
constexpr double kHangSeconds = 300;

TEST(NcclCollectives, EveryCollectiveMatchesItsClosedFormOnTwoGpus) {
  if (!have_two_gpus()) GTEST_SKIP() << "needs 2 CUDA devices";
  auto r = run("--standalone --nproc-per-node 2 -- " + kWorker + " nccl_collectives");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_CONTAINS(r.output, line("0", "collectives OK on rank 0 of 2"));
  EXPECT_CONTAINS(r.output, line("1", "collectives OK on rank 1 of 2"));
}

TEST(NcclFailures, APeerThatLeavesMakesTheOtherFailNamingTheOperation) {
  if (!have_two_gpus()) GTEST_SKIP() << "needs 2 CUDA devices";
  auto r = run("--standalone --nproc-per-node 2 -- " + kWorker + " nccl_peer_exits");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(count(r.output, "[0]: expected error: "), 1) << r.output;
  // The watchdog's 1.5 s timeout, its polling and the abort: seconds, however long start-up took.
  EXPECT_GE(failed_after(r.output), 0) << r.output;
  EXPECT_LT(failed_after(r.output), 10) << r.output;
  EXPECT_LT(r.seconds, kHangSeconds);
}

TEST(NcclFailures, AStalledPeerMakesTheWatchdogAbortWithinTheTimeout) {
  if (!have_two_gpus()) GTEST_SKIP() << "needs 2 CUDA devices";
  auto r = run("--standalone --nproc-per-node 2 -- " + kWorker + " nccl_peer_stalls");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_CONTAINS(r.output, "timed out");
  EXPECT_CONTAINS(r.output, "[1]: peer left");
  EXPECT_GE(failed_after(r.output), 0) << r.output;
  EXPECT_LT(failed_after(r.output), 10) << r.output;
  EXPECT_LT(r.seconds, kHangSeconds);
}

TEST(DptRun, PrefixesEveryOutputLineWithTheRank) {
  auto r = run("--standalone --nproc-per-node 2 -- sh -c 'echo out $RANK; echo err $RANK >&2; printf \"no newline\"'");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  for (std::string rank : {"0", "1"}) {
    EXPECT_CONTAINS(r.output, line(rank, "out " + rank + "\n"));
    EXPECT_CONTAINS(r.output, line(rank, "err " + rank + "\n"));
    EXPECT_CONTAINS(r.output, line(rank, "no newline\n"));
  }
}

TEST(DptRun, GivesWorkersTheTorchrunEnvironment) {
  auto r = run("--nproc-per-node 2 --nnodes 2 --node-rank 1 --master-addr 10.9.8.7 --master-port 1234 -- sh -c "
               "'echo R=$RANK L=$LOCAL_RANK W=$WORLD_SIZE LW=$LOCAL_WORLD_SIZE G=$GROUP_RANK A=$MASTER_ADDR "
               "P=$MASTER_PORT C=$DPT_RESTART_COUNT NVLS=$NCCL_NVLS_ENABLE OMP=$OMP_NUM_THREADS'",
               "env -u OMP_NUM_THREADS -u NCCL_NVLS_ENABLE");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_CONTAINS(r.output, "[2]: R=2 L=0 W=4 LW=2 G=1 A=10.9.8.7 P=1234 C=0 NVLS=0 OMP=1\n");
  EXPECT_CONTAINS(r.output, "[3]: R=3 L=1 W=4 LW=2 G=1 A=10.9.8.7 P=1234 C=0 NVLS=0 OMP=1\n");
  // torchrun's spellings: the rendezvous endpoint, its restart and run-id variables, the count by device.
  auto torchrun = run("--nproc-per-node cpu --nnodes 2 --node-rank 1 --rdzv-endpoint 10.9.8.7:1234 --rdzv-id job7 "
                      "-- sh -c 'echo A=$MASTER_ADDR P=$MASTER_PORT T=$TORCHELASTIC_RESTART_COUNT "
                      "I=$TORCHELASTIC_RUN_ID LW=$LOCAL_WORLD_SIZE'");
  EXPECT_EQ(torchrun.exit_code, 0) << torchrun.output;
  const long cores = ::sysconf(_SC_NPROCESSORS_ONLN);
  EXPECT_CONTAINS(torchrun.output, "A=10.9.8.7 P=1234 T=0 I=job7 LW=" + std::to_string(cores) + "\n");
  if (dpt::cuda::device_count() == 0) {
    EXPECT_EQ(run("--standalone --nproc-per-node gpu -- true").exit_code, 2);
    auto cpu = run("--standalone --nproc-per-node auto -- sh -c 'echo LW=$LOCAL_WORLD_SIZE'");
    EXPECT_CONTAINS(cpu.output, "LW=" + std::to_string(cores) + "\n");
  }
  // The user's own settings win.
  auto kept = run("--standalone --nproc-per-node 1 -- sh -c 'echo NVLS=$NCCL_NVLS_ENABLE OMP=$OMP_NUM_THREADS'",
                  "env NCCL_NVLS_ENABLE=1 OMP_NUM_THREADS=8");
  EXPECT_CONTAINS(kept.output, "[0]: NVLS=1 OMP=8\n");
}

TEST(DptRun, AWorkerExitingWith3StopsTheOthersAndExitsWith3) {
  auto r = run("--standalone --nproc-per-node 3 -- " + kWorker + " exit3");
  EXPECT_EQ(r.exit_code, 3) << r.output;
  EXPECT_EQ(count(r.output, "survived"), 0) << r.output;
  EXPECT_CONTAINS(r.output, "root cause");
  EXPECT_CONTAINS(r.output, "rank       : 1 (local rank 1, node 0)");
  EXPECT_CONTAINS(r.output, "exit code  : 3");
  EXPECT_LT(r.seconds, 30);  // the others sleep 60 s unless stopped
}

TEST(DptRun, AWorkerKilledBySignalIsReportedWithTheSignal) {
  auto r = run("--standalone --nproc-per-node 2 -- sh -c 'if [ $RANK = 1 ]; then kill -9 $$; fi; sleep 60'");
  EXPECT_EQ(r.exit_code, 128 + 9) << r.output;
  EXPECT_CONTAINS(r.output, "signal     : 9");
  EXPECT_LT(r.seconds, 30);
}

TEST(DptRun, RestartsTheWholeGroupUpToMaxRestartsThenReportsTheFailure) {
  auto r = run("--standalone --nproc-per-node 2 --max-restarts 2 -- sh -c 'echo attempt $DPT_RESTART_COUNT; exit 4'");
  EXPECT_EQ(r.exit_code, 4) << r.output;
  EXPECT_CONTAINS(r.output, "restart 1 of 2");
  EXPECT_CONTAINS(r.output, "restart 2 of 2");
  EXPECT_EQ(count(r.output, "restart 3 of"), 0);
  EXPECT_CONTAINS(r.output, "attempts   : 3 (max restarts 2)");

  auto ok = run(
      "--standalone --nproc-per-node 2 --max-restarts 3 -- sh -c '[ $DPT_RESTART_COUNT = 1 ] || exit 4; echo done'");
  EXPECT_EQ(ok.exit_code, 0) << ok.output;
  EXPECT_EQ(count(ok.output, "done"), 2) << ok.output;
}

TEST(DptRun, ARestartedGroupRendezvousesAgainAndRuns) {
  auto r = run("--standalone --nproc-per-node 2 --max-restarts 1 -- " + kWorker + " restart_once");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_CONTAINS(r.output, "[0]: attempt 1 OK");
  EXPECT_CONTAINS(r.output, "[1]: attempt 1 OK");
  EXPECT_LT(r.seconds, 60);
}

TEST(DptRun, ForwardsSigtermToEveryWorker) {
  int out[2];
  ASSERT_EQ(::pipe(out), 0);
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::dup2(out[1], 1);
    ::dup2(out[1], 2);
    ::close(out[0]);
    ::execl(kRun.c_str(), kRun.c_str(), "--standalone", "--nproc-per-node", "3", "--", kWorker.c_str(), "signal",
            nullptr);
    ::_exit(127);
  }
  ::close(out[1]);
  std::string output;
  auto read_some = [&](int timeout_ms) {
    pollfd pfd{out[0], POLLIN, 0};
    if (::poll(&pfd, 1, timeout_ms) <= 0) return false;
    char buf[4096];
    ssize_t n = ::read(out[0], buf, sizeof(buf));
    if (n <= 0) return false;
    output.append(buf, static_cast<size_t>(n));
    return true;
  };
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (count(output, "ready") < 3 && std::chrono::steady_clock::now() < deadline) read_some(100);
  ASSERT_EQ(count(output, "ready"), 3) << output;
  ::kill(pid, SIGTERM);
  while (read_some(10000)) {
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  ::close(out[0]);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 128 + SIGTERM) << output;
  EXPECT_EQ(count(output, "got SIGTERM"), 3) << output;
}

TEST(DptRun, RejectsBadCommandLines) {
  EXPECT_EQ(run("--nproc-per-node 2").exit_code, 2);
  EXPECT_EQ(run("--nproc-per-node 0 -- true").exit_code, 2);
  EXPECT_EQ(run("--nnodes 2 --node-rank 2 -- true").exit_code, 2);
  EXPECT_EQ(run("--standalone --master-port 5 -- true").exit_code, 2);
  EXPECT_EQ(run("--nproc-per-node many -- true").exit_code, 2);
  EXPECT_EQ(run("--rdzv-endpoint 10.0.0.1 -- true").exit_code, 2);
  auto r = run("--standalone --nproc-per-node 1 -- /nonexistent/program");
  EXPECT_EQ(r.exit_code, 127) << r.output;
  EXPECT_CONTAINS(r.output, "cannot execute '/nonexistent/program'");
}

}  // namespace
