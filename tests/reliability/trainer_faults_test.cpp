// Faults of a running dpt-train job: a worker SIGKILLed mid-training (the last good checkpoint stays
// intact; with --max-restarts 1 and resume: auto the job finishes with the uninterrupted run's final
// loss), a disk that fills up during a checkpoint, and a checkpoint directory that turns read-only.
// Each must give a clear error and leave the previous checkpoint loadable.
#include <gtest/gtest.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "apps/train_test_util.h"
#include "core/error.h"
#include "optim/checkpoint.h"
#include "processes.h"

namespace {

namespace fs = std::filesystem;
using dpt::reliability::Child;
using dpt::reliability::Finished;
using dpt::reliability::kBin;
using dpt::reliability::reachable_by_others;
using dpt::reliability::ScratchDir;
using dpt::reliability::step_dir;
using dpt::train::test_util::read_metrics;
using dpt::train::test_util::train_records;


const std::string kConfig = DPT_SOURCE_DIR "/configs/mlp_synthetic.yaml";
constexpr double kLimit = 240;  // seconds: far above what any run here needs; only catches hangs


// dpt-run (nproc workers, `extra` launcher flags) over dpt-train with `overrides`.
std::vector<std::string> train_argv(int nproc, const std::vector<std::string>& extra,
                                    const std::vector<std::string>& overrides) {
  std::vector<std::string> argv = {kBin + "dpt-run", "--standalone", "--nproc-per-node", std::to_string(nproc),
                                   "--grace-period", "2"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  argv.insert(argv.end(), {"--", kBin + "dpt-train", "--config", kConfig});
  for (const auto& o : overrides) argv.insert(argv.end(), {"--set", o});
  return argv;
}

bool wait_for_path(const std::string& path, double limit_s) {
  auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(limit_s);
  while (std::chrono::steady_clock::now() < end) {
    if (fs::exists(path)) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return false;
}

// The worker of `launcher` whose environment says RANK=<rank> (0 when not found).
pid_t worker_pid(pid_t launcher, int rank) {
  std::ifstream children("/proc/" + std::to_string(launcher) + "/task/" + std::to_string(launcher) + "/children");
  for (pid_t pid; children >> pid;) {
    std::ifstream env("/proc/" + std::to_string(pid) + "/environ", std::ios::binary);
    std::string all((std::istreambuf_iterator<char>(env)), {});
    if (all.find(std::string("\0RANK=", 6) + std::to_string(rank) + '\0') != std::string::npos) return pid;
  }
  return 0;
}

// The checkpoint in `dir` loads and validates, and is of `step`.
void expect_loadable(const std::string& dir, int64_t step) {
  try {
    auto c = dpt::optim::load_checkpoint(dir + "/checkpoint");
    EXPECT_EQ(c.state.step, step) << dir;
    EXPECT_FALSE(c.model.empty()) << dir;
  } catch (const dpt::Error& e) {
    ADD_FAILURE() << "checkpoint " << dir << " does not load: " << e.what();
  }
}

std::string final_loss(const std::string& metrics, int64_t* step) {
  auto records = train_records(read_metrics(metrics));
  if (records.empty()) return "none";
  *step = records.back().step;
  return records.back().loss;
}

std::vector<std::string> base_overrides(const std::string& run, int64_t steps) {
  return {"training.device=cpu", "training.steps=" + std::to_string(steps), "training.batch_size=32",
          "checkpoint.every=100", "checkpoint.keep=3", "logging.every=50", "eval.every=0",
          "checkpoint.dir=" + run};
}

TEST(TrainerFaults, AWorkerKilledMidTrainingLeavesTheLastCheckpointIntact) {
  ScratchDir dir;
  const std::string run = dir.file("run");
  Child job(train_argv(2, {}, base_overrides(run, 5000)), dir.file("job.log"));
  ASSERT_TRUE(wait_for_path(step_dir(run, 200), kLimit)) << job.output();
  pid_t victim = worker_pid(job.pid(), 1);
  ASSERT_NE(victim, 0) << "rank 1's process not found";
  ::kill(victim, SIGKILL);
  Finished f = job.wait(kLimit);
  ASSERT_FALSE(f.hung) << f.output;
  EXPECT_EQ(f.exit_code, 128 + SIGKILL) << f.output;
  EXPECT_CONTAINS(f.output, "signal     : 9 (Killed)");
  // Every complete step directory loads, the newest included; the kill may leave a temporary one.
  int64_t newest = 0;
  for (const auto& e : fs::directory_iterator(run)) {
    std::string name = e.path().filename().string();
    if (name.rfind("step_", 0) != 0 || name.find(".tmp") != std::string::npos) continue;
    int64_t step = std::stoll(name.substr(5));
    newest = std::max(newest, step);
    expect_loadable(e.path().string(), step);
  }
  EXPECT_GE(newest, 200);
}

TEST(TrainerFaults, WithMaxRestartsAndAutoResumeAKilledJobFinishesWithTheUninterruptedFinalLoss) {
  ScratchDir dir;
  const int64_t steps = 1500;
  const std::string clean_run = dir.file("clean"), faulty_run = dir.file("faulty");
  Child clean(train_argv(2, {}, base_overrides(clean_run, steps)), dir.file("clean.log"));
  Finished c = clean.wait(kLimit);
  ASSERT_EQ(c.exit_code, 0) << c.output;

  auto overrides = base_overrides(faulty_run, steps);
  overrides.push_back("checkpoint.resume=auto");
  Child job(train_argv(2, {"--max-restarts", "1"}, overrides), dir.file("faulty.log"));
  ASSERT_TRUE(wait_for_path(step_dir(faulty_run, 300), kLimit)) << job.output();
  pid_t victim = worker_pid(job.pid(), 1);
  ASSERT_NE(victim, 0);
  ::kill(victim, SIGKILL);
  Finished f = job.wait(kLimit);
  ASSERT_FALSE(f.hung) << f.output;
  EXPECT_EQ(f.exit_code, 0) << f.output;
  EXPECT_CONTAINS(f.output, "rank 1 failed (signal 9); restarting the worker group (restart 1 of 1)");

  int64_t clean_step = -1, faulty_step = -2;
  std::string clean_loss = final_loss(clean_run + "/metrics.jsonl", &clean_step);
  std::string faulty_loss = final_loss(faulty_run + "/metrics.jsonl", &faulty_step);
  EXPECT_EQ(clean_step, steps);
  EXPECT_EQ(faulty_step, steps);
  EXPECT_EQ(faulty_loss, clean_loss) << f.output;
  expect_loadable(step_dir(faulty_run, steps), steps);
}

// A tmpfs of `size` mounted at `path`; false where mounting is not permitted (not root, or no
// CAP_SYS_ADMIN in a container).
bool mount_tmpfs(const std::string& path, const std::string& size) {
  fs::create_directories(path);
  return ::mount("dpt_test", path.c_str(), "tmpfs", 0, ("size=" + size).c_str()) == 0;
}

struct Unmount {
  std::string path;
  ~Unmount() { ::umount2(path.c_str(), MNT_DETACH); }
};

TEST(TrainerFaults, ADiskThatFillsUpDuringACheckpointIsAClearErrorAndThePreviousCheckpointStays) {
  ScratchDir dir;
  const std::string disk = dir.file("disk");
  // A checkpoint of the [2, 256, 256, 3] MLP with AdamW state is about 810 KB: one fits, two do not.
  if (!mount_tmpfs(disk, "1200k")) GTEST_SKIP() << "mounting a tmpfs is not permitted here";
  Unmount unmount{disk};
  const std::string run = disk + "/run";
  auto overrides = base_overrides(run, 300);
  overrides.push_back("model.mlp.hidden=[256,256]");
  Child job(train_argv(1, {}, overrides), dir.file("job.log"));
  Finished f = job.wait(kLimit);
  ASSERT_FALSE(f.hung) << f.output;
  EXPECT_NE(f.exit_code, 0) << f.output;
  EXPECT_CONTAINS(f.output, "No space left on device");
  EXPECT_CONTAINS(f.output, run);
  expect_loadable(step_dir(run, 100), 100);
  EXPECT_FALSE(fs::exists(step_dir(run, 200))) << f.output;
}

TEST(TrainerFaults, ACheckpointDirectoryThatBecomesUnwritableIsAClearErrorAndThePreviousCheckpointStays) {
  ScratchDir dir;
  const std::string run = dir.file("run");
  fs::create_directories(run);
  auto overrides = base_overrides(run, 20000);
  overrides.push_back("checkpoint.every=1000");
  auto argv = train_argv(1, {}, overrides);
  if (::geteuid() == 0) {
    // Root writes through permission bits: the job runs as an unprivileged user instead.
    if (!fs::exists("/usr/bin/setpriv")) GTEST_SKIP() << "running as root without setpriv(1)";
    for (const fs::path& p : {fs::path(kBin) / "dpt-train", dir.path()}) {
      if (!reachable_by_others(p)) GTEST_SKIP() << "running as root, and an unprivileged user cannot reach " << p;
    }
    ASSERT_EQ(::chown(run.c_str(), 65534, 65534), 0) << std::strerror(errno);
    argv.insert(argv.begin(), {"/usr/bin/setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"});
  }
  Child job(argv, dir.file("job.log"));
  ASSERT_TRUE(wait_for_path(step_dir(run, 1000), kLimit)) << job.output();
  fs::permissions(run, fs::perms::owner_read | fs::perms::owner_exec | fs::perms::group_read |
                           fs::perms::group_exec | fs::perms::others_read | fs::perms::others_exec);
  Finished f = job.wait(kLimit);
  fs::permissions(run, fs::perms::owner_all, fs::perm_options::add);
  ASSERT_FALSE(f.hung) << f.output;
  EXPECT_NE(f.exit_code, 0) << f.output;
  EXPECT_CONTAINS(f.output, "Permission denied");
  EXPECT_CONTAINS(f.output, run);
  expect_loadable(step_dir(run, 1000), 1000);
  EXPECT_FALSE(fs::exists(step_dir(run, 2000))) << f.output;
}

}  // namespace
