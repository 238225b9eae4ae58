// Checkpoints that cannot be trusted or read must cost nothing. A checkpoint is damaged only when its
// bytes prove it (checksum, sizes, non-finite values, a step other than its name's): it is passed over
// and set aside, never deleted. One that cannot be read (permissions; as root, a directory or FIFO where
// a file belongs) stops the run with an error naming it, and nothing in the run directory changes.
// Retention never deletes a checkpoint newer than the one the run continues from; stray names and
// leftovers of crashed saves are handled without failing the run.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <regex>
#include <string>
#include <vector>

#include "apps/train_test_util.h"
#include "core/factory.h"
#include "core/safetensors.h"
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
using dpt::train::test_util::read_text;
using dpt::train::test_util::snapshot;
using dpt::train::test_util::train_records;


const std::string kConfig = DPT_SOURCE_DIR "/configs/mlp_synthetic.yaml";
constexpr double kLimit = 120;  // seconds: far above what any run here needs; only catches hangs


// The run of the report: 20 steps, a checkpoint every 5, all ten kept.
std::vector<std::string> run_args(const std::string& run, int64_t steps) {
  return {"--config", kConfig,
          "--set",    "training.device=cpu",
          "--set",    "training.steps=" + std::to_string(steps),
          "--set",    "schedule.warmup_steps=2",
          "--set",    "checkpoint.every=5",
          "--set",    "checkpoint.keep=10",
          "--set",    "checkpoint.dir=" + run};
}

Finished train(const ScratchDir& dir, const std::string& run, int64_t steps, const std::vector<std::string>& extra = {},
               const std::vector<std::string>& prefix = {}) {
  std::vector<std::string> argv = prefix;
  argv.push_back(kBin + "dpt-train");
  for (const auto& a : run_args(run, steps)) argv.push_back(a);
  for (const auto& e : extra) argv.insert(argv.end(), {"--set", e});
  static int n = 0;
  Child child(argv, dir.file("train" + std::to_string(n++) + ".log"));
  return child.wait(kLimit);
}

// A finished 20-step run in dir/run, checkpoints at 5, 10, 15, 20.
std::string trained_run(const ScratchDir& dir) {
  const std::string run = dir.file("run");
  Finished f = train(dir, run, 20);
  EXPECT_EQ(f.exit_code, 0) << f.output;
  for (int64_t s : {5, 10, 15, 20}) EXPECT_TRUE(fs::exists(step_dir(run, s))) << f.output;
  return run;
}

// The entries of `run` named step_N.set-aside-*.
std::vector<std::string> set_aside(const std::string& run, int64_t step) {
  std::vector<std::string> out;
  const std::string prefix = fs::path(step_dir(run, step)).filename().string() + ".set-aside-";
  for (const auto& e : fs::directory_iterator(run)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(prefix, 0) == 0) out.push_back(e.path().string());
  }
  return out;
}

std::string last_loss(const std::string& run) {
  auto records = train_records(read_metrics(run + "/metrics.jsonl"));
  return records.empty() ? "none" : records.back().loss;
}

// --- unreadable checkpoints ----------------------------------------------------------------------

// Root reads through permission bits, so an unreadable checkpoint is made from what root cannot read
// either: a directory where its model file belongs.
TEST(CheckpointSafety, UnreadableCheckpointsStopTheRunAndNothingIsDeletedOrTruncated) {
  ScratchDir dir;
  const std::string run = trained_run(dir);
  for (int64_t s : {5, 10, 15, 20}) {
    const std::string file = step_dir(run, s) + "/checkpoint.model.safetensors";
    fs::remove(file);
    fs::create_directories(file);
  }
  const auto before = snapshot(run);
  Finished f = train(dir, run, 7);
  ASSERT_FALSE(f.hung) << f.output;
  EXPECT_EQ(f.exit_code, 1) << f.output;
  EXPECT_CONTAINS(f.output, "cannot read checkpoint '" + step_dir(run, 20) + "'");
  EXPECT_CONTAINS(f.output, step_dir(run, 20) + "/checkpoint.model.safetensors' is a directory");
  EXPECT_CONTAINS(f.output, "nothing in '" + run + "' was changed");
  EXPECT_EQ(snapshot(run), before);  // metrics.jsonl and every checkpoint file, byte for byte
  for (int64_t s : {5, 10, 15, 20}) EXPECT_TRUE(fs::is_directory(step_dir(run, s) + "/checkpoint.model.safetensors"));
}

TEST(CheckpointSafety, ACheckpointWithoutReadPermissionStopsTheRunAndNothingChanges) {
  ScratchDir dir;
  const std::string run = dir.file("run");
  fs::create_directories(run);
  std::vector<std::string> prefix;
  if (::geteuid() == 0) {
    // Root reads through permission bits: the runs are made by an unprivileged user instead.
    if (!fs::exists("/usr/bin/setpriv")) GTEST_SKIP() << "running as root without setpriv(1)";
    for (const fs::path& p : {fs::path(kBin) / "dpt-train", fs::path(kConfig).parent_path(), dir.path()}) {
      if (!reachable_by_others(p)) GTEST_SKIP() << "running as root, and an unprivileged user cannot reach " << p;
    }
    ASSERT_EQ(::chown(run.c_str(), 65534, 65534), 0) << std::strerror(errno);
    prefix = {"/usr/bin/setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"};
  }
  Finished first = train(dir, run, 20, {}, prefix);
  ASSERT_EQ(first.exit_code, 0) << first.output;
  for (int64_t s : {5, 10, 15, 20})
    fs::permissions(step_dir(run, s) + "/checkpoint.model.safetensors", fs::perms::none);
  const auto before = snapshot(run);
  Finished f = train(dir, run, 7, {}, prefix);
  ASSERT_FALSE(f.hung) << f.output;
  EXPECT_EQ(f.exit_code, 1) << f.output;
  EXPECT_CONTAINS(f.output, "Permission denied");
  EXPECT_CONTAINS(f.output, step_dir(run, 20) + "/checkpoint.model.safetensors");
  EXPECT_EQ(snapshot(run), before);
}

// --- damaged checkpoints: passed over, set aside --------------------------------------------------

TEST(CheckpointSafety, AFiniteBitFlipIsFoundByTheChecksumAndTheCheckpointIsSetAsideNotDeleted) {
  ScratchDir dir;
  const std::string run = trained_run(dir);
  const std::string reference_loss = last_loss(run);
  const std::string file = step_dir(run, 20) + "/checkpoint.model.safetensors";
  std::string bytes = read_text(file);
  bytes[bytes.size() - 3] = static_cast<char>(bytes[bytes.size() - 3] ^ 0x01);  // a low mantissa bit: still finite
  { std::ofstream(file, std::ios::binary | std::ios::trunc) << bytes; }
  Finished f = train(dir, run, 20);
  ASSERT_EQ(f.exit_code, 0) << f.output;
  EXPECT_CONTAINS(f.output, "skipping a damaged checkpoint: " + step_dir(run, 20));
  EXPECT_CONTAINS(f.output, "fails its checksum");
  EXPECT_CONTAINS(f.output, "resuming from " + step_dir(run, 15) + " at step 15");
  // The run redid steps 16-20 exactly; the damaged checkpoint is still there, renamed, byte for byte.
  EXPECT_EQ(last_loss(run), reference_loss);
  const auto aside = set_aside(run, 20);
  ASSERT_EQ(aside.size(), 1u) << f.output;
  EXPECT_EQ(read_text(aside[0] + "/checkpoint.model.safetensors"), bytes);
}

TEST(CheckpointSafety, NonFiniteWeightsAreRefusedNamingTheTensorAndFile) {
  ScratchDir dir;
  const std::string run = trained_run(dir);
  // A NaN written with valid checksums (as a run that diverged would have saved it).
  const std::string prefix = step_dir(run, 20) + "/checkpoint";
  auto ck = dpt::optim::load_checkpoint(prefix);
  ASSERT_FALSE(ck.model.empty());
  const std::string name = ck.model[0].first;
  std::vector<float> values = ck.model[0].second.to_vector<float>();
  values[1] = std::nanf("");
  ck.model[0].second = dpt::from_vector<float>(values, ck.model[0].second.shape());
  dpt::optim::save_checkpoint(prefix, ck.model, ck.optimizer, ck.state);
  Finished f = train(dir, run, 25);
  ASSERT_EQ(f.exit_code, 0) << f.output;
  EXPECT_CONTAINS(f.output, "skipping a damaged checkpoint");
  EXPECT_CONTAINS(f.output, "checkpoint '" + prefix + ".model.safetensors': tensor '" + name +
                                "' holds a non-finite value (inf or NaN) at element 1");
  EXPECT_CONTAINS(f.output, "at step 15");
  EXPECT_EQ(f.output.find("non-finite loss"), std::string::npos) << f.output;
  EXPECT_EQ(set_aside(run, 20).size(), 1u);
}

// Metadata that dpt-train wrote as a number and that no longer reads as one (an edited file, with valid
// checksums) stops the run naming the entry and its value: neither skipped as a default nor changed.
TEST(CheckpointSafety, MalformedNumbersInTheMetadataStopTheRunNamingTheEntry) {
  ScratchDir dir;
  const std::string run = trained_run(dir);
  const std::string prefix = step_dir(run, 20) + "/checkpoint";
  auto ck = dpt::optim::load_checkpoint(prefix);
  ASSERT_EQ(ck.state.extra.count("train.best_val_loss"), 1u);
  ASSERT_EQ(ck.state.extra.count("train.best_val_step"), 1u);
  ck.state.extra["train.best_val_step"] = "20";
  ck.state.extra["train.best_val_loss"] = "1.5x";
  dpt::optim::save_checkpoint(prefix, ck.model, ck.optimizer, ck.state);
  const auto before = snapshot(run);
  Finished f = train(dir, run, 25);
  ASSERT_FALSE(f.hung) << f.output;
  EXPECT_EQ(f.exit_code, 1) << f.output;
  EXPECT_CONTAINS(f.output, "checkpoint metadata 'train.best_val_loss' = '1.5x' is not a number");
  EXPECT_EQ(snapshot(run), before);
}

TEST(CheckpointSafety, ACheckpointWhoseNameAndStepDisagreeIsDamage) {
  ScratchDir dir;
  const std::string run = trained_run(dir);
  fs::rename(step_dir(run, 20), step_dir(run, 25));  // holds step 20, named 25
  Finished f = train(dir, run, 30);
  ASSERT_EQ(f.exit_code, 0) << f.output;
  EXPECT_CONTAINS(f.output, "skipping a damaged checkpoint: " + step_dir(run, 25));
  EXPECT_CONTAINS(f.output, "it holds step 20, not the step 25 its name says");
  EXPECT_CONTAINS(f.output, "at step 15");
  EXPECT_EQ(set_aside(run, 25).size(), 1u);
}

TEST(CheckpointSafety, CheckpointsWithoutChecksumsStillResumeAndSaySo) {
  ScratchDir dir;
  const std::string run = trained_run(dir);
  // Both files of step 20 as a writer without checksums leaves them: the same header without them.
  for (const char* which : {"model", "optim"}) {
    const std::string file = step_dir(run, 20) + "/checkpoint." + which + ".safetensors";
    const std::string bytes = read_text(file);
    uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(bytes[static_cast<size_t>(i)]);
    std::string header = std::regex_replace(bytes.substr(8, n), std::regex(R"("crc32c\.[^"]*":"[0-9a-f]{8}",)"), "");
    while (header.size() % 8) header += ' ';
    std::string length(8, '\0');
    for (int i = 0; i < 8; ++i) length[static_cast<size_t>(i)] = static_cast<char>(header.size() >> (8 * i));
    std::ofstream(file, std::ios::binary | std::ios::trunc) << length + header + bytes.substr(8 + n);
    ASSERT_FALSE(dpt::load_safetensors(file).checksummed) << file;
  }
  Finished f = train(dir, run, 25);
  ASSERT_EQ(f.exit_code, 0) << f.output;
  EXPECT_CONTAINS(f.output, "checkpoint " + step_dir(run, 20) + " has no checksums");
  EXPECT_CONTAINS(f.output, "at step 20");
}

// --- retention ------------------------------------------------------------------------------------

TEST(CheckpointSafety, ResumingFromAnOlderCheckpointSetsTheNewerOnesAsideAndDeletesNone) {
  ScratchDir dir;
  const std::string run = trained_run(dir);
  const std::string model15 = read_text(step_dir(run, 15) + "/checkpoint.model.safetensors");
  const std::string model20 = read_text(step_dir(run, 20) + "/checkpoint.model.safetensors");
  Finished f = train(dir, run, 20, {"checkpoint.resume=" + step_dir(run, 10)});
  ASSERT_EQ(f.exit_code, 0) << f.output;
  EXPECT_CONTAINS(f.output, "set aside a checkpoint newer than step 10");
  // This run's own 15 and 20 are new; the abandoned ones are kept beside them.
  ASSERT_EQ(set_aside(run, 15).size(), 1u) << f.output;
  ASSERT_EQ(set_aside(run, 20).size(), 1u) << f.output;
  EXPECT_EQ(read_text(set_aside(run, 15)[0] + "/checkpoint.model.safetensors"), model15);
  EXPECT_EQ(read_text(set_aside(run, 20)[0] + "/checkpoint.model.safetensors"), model20);
  for (int64_t s : {5, 10, 15, 20}) EXPECT_TRUE(fs::exists(step_dir(run, s))) << s;
}

TEST(CheckpointSafety, ResumeNeverSetsEveryCheckpointAsideAndDeletesNone) {
  ScratchDir dir;
  const std::string run = trained_run(dir);
  Finished f = train(dir, run, 7, {"checkpoint.resume=never"});
  ASSERT_EQ(f.exit_code, 0) << f.output;
  for (int64_t s : {5, 10, 15, 20}) EXPECT_EQ(set_aside(run, s).size(), 1u) << s << "\n" << f.output;
  EXPECT_TRUE(fs::exists(step_dir(run, 5)));
  EXPECT_TRUE(fs::exists(step_dir(run, 7)));
}

// --- stray names and leftovers --------------------------------------------------------------------

TEST(CheckpointSafety, AStepNumberPast64BitsIsIgnoredWithAWarning) {
  ScratchDir dir;
  const std::string run = trained_run(dir);
  fs::create_directories(run + "/step_99999999999999999999");
  Finished f = train(dir, run, 25);
  ASSERT_EQ(f.exit_code, 0) << f.output;
  EXPECT_CONTAINS(f.output, run + "/step_99999999999999999999: the step number does not fit 64 bits");
  EXPECT_CONTAINS(f.output, "at step 20");
  EXPECT_TRUE(fs::exists(run + "/step_99999999999999999999"));
}

TEST(CheckpointSafety, LeftoversOfDeadProcessesAreRemovedAndALiveProcesssAreKept) {
  ScratchDir dir;
  const std::string run = trained_run(dir);
  // A process that has exited (and been reaped) and this test's own, alive.
  const pid_t dead = ::fork();
  if (dead == 0) ::_exit(0);
  ASSERT_GT(dead, 0);
  ::waitpid(dead, nullptr, 0);
  const std::string dead_tmp = step_dir(run, 25) + ".tmp-" + std::to_string(dead);
  const std::string live_tmp = step_dir(run, 30) + ".tmp-" + std::to_string(::getpid());
  for (const auto& d : {dead_tmp, live_tmp}) {
    fs::create_directories(d);
    std::ofstream(d + "/checkpoint.optim.safetensors") << "partial";
  }
  Finished f = train(dir, run, 25);
  ASSERT_EQ(f.exit_code, 0) << f.output;
  EXPECT_FALSE(fs::exists(dead_tmp)) << f.output;
  EXPECT_CONTAINS(f.output, "removed " + dead_tmp);
  EXPECT_TRUE(fs::exists(live_tmp + "/checkpoint.optim.safetensors")) << f.output;
}

}  // namespace
