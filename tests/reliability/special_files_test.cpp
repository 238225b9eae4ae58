// Files that are not what they claim, and a trainer that must not wait for them: a FIFO as a data file
// or as a checkpoint file is refused at once (opening one used to block forever, deaf to SIGINT and
// SIGTERM); a stop signal during setup (here: waiting for ranks that never come) ends the process at
// once, and a second one ends a trainer stuck in a step.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "apps/train_test_util.h"
#include "data/token_file.h"
#include "processes.h"
#include "rendezvous/socket.h"

namespace {

namespace fs = std::filesystem;
using dpt::reliability::Child;
using dpt::reliability::Finished;
using dpt::reliability::kBin;
using dpt::reliability::ScratchDir;
using dpt::train::test_util::read_text;
using dpt::train::test_util::snapshot;


constexpr double kLimit = 120;  // seconds: only catches hangs (the old trainer blocked here forever)

std::vector<std::string> trainer(const std::string& config, const std::vector<std::string>& overrides) {
  std::vector<std::string> argv = {kBin + "dpt-train", "--config", DPT_SOURCE_DIR "/configs/" + config};
  for (const auto& o : overrides) argv.insert(argv.end(), {"--set", o});
  return argv;
}

// A small GPT on token files: the data path is the test's.
std::vector<std::string> token_gpt(const std::string& run, const std::string& kind, const std::string& path) {
  return {"training.device=cpu",  "training.steps=2",    "schedule.warmup_steps=1", "model.gpt.n_layer=1",
          "model.gpt.n_head=2",   "model.gpt.n_embd=16", "data.seq_len=8",          "training.batch_size=4",
          "eval.sample_tokens=0", "data.kind=" + kind,   "data.path=" + path,       "data.val_fraction=0.1",
          "checkpoint.dir=" + run};
}

TEST(SpecialFiles, AFifoAsTheTokenFileIsRefusedWithoutBlocking) {
  ScratchDir dir;
  const std::string fifo = dir.file("tokens.bin");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  Child child(trainer("char_gpt.yaml", token_gpt(dir.file("run"), "tokens", fifo)), dir.file("log"));
  Finished f = child.wait(kLimit);
  ASSERT_FALSE(f.hung) << "dpt-train blocked opening a FIFO:\n" << f.output;
  EXPECT_EQ(f.exit_code, 1) << f.output;
  EXPECT_CONTAINS(f.output, "token file '" + fifo + "' is a FIFO, not a regular file");
  EXPECT_FALSE(fs::exists(dir.file("run/metrics.jsonl"))) << f.output;
}

TEST(SpecialFiles, AFifoAsTheMetricsFileIsRefusedWithoutBlocking) {
  ScratchDir dir;
  const std::string fifo = dir.file("metrics.jsonl");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  Child child(trainer("mlp_synthetic.yaml", {"training.device=cpu", "training.steps=2", "schedule.warmup_steps=1",
                                             "logging.metrics_file=" + fifo, "checkpoint.dir=" + dir.file("run")}),
              dir.file("log"));
  Finished f = child.wait(kLimit);
  ASSERT_FALSE(f.hung) << "dpt-train blocked opening a FIFO:\n" << f.output;
  EXPECT_EQ(f.exit_code, 1) << f.output;
  EXPECT_CONTAINS(f.output, "the metrics file '" + fifo + "' is a FIFO");
}

TEST(SpecialFiles, AFifoAsACheckpointFileIsRefusedWithoutBlockingAndNothingChanges) {
  ScratchDir dir;
  const std::string run = dir.file("run");
  const std::vector<std::string> args = {"training.device=cpu", "training.steps=10", "schedule.warmup_steps=2",
                                         "checkpoint.every=5", "checkpoint.dir=" + run};
  Finished first = Child(trainer("mlp_synthetic.yaml", args), dir.file("first.log")).wait(kLimit);
  ASSERT_EQ(first.exit_code, 0) << first.output;
  const std::string file = run + "/step_00000010/checkpoint.optim.safetensors";
  fs::remove(file);
  ASSERT_EQ(::mkfifo(file.c_str(), 0600), 0);
  const auto before = snapshot(run);
  Finished f = Child(trainer("mlp_synthetic.yaml", args), dir.file("second.log")).wait(kLimit);
  ASSERT_FALSE(f.hung) << "dpt-train blocked opening a FIFO:\n" << f.output;
  EXPECT_EQ(f.exit_code, 1) << f.output;
  EXPECT_CONTAINS(f.output, "safetensors file '" + file + "' is a FIFO, not a regular file");
  EXPECT_EQ(snapshot(run), before);
  struct stat st {};
  ASSERT_EQ(::stat(file.c_str(), &st), 0);
  EXPECT_TRUE(S_ISFIFO(st.st_mode));
}

// True once some socket listens on TCP `port` (of this network namespace): /proc/net/tcp lists each
// socket as "sl local_address:port(hex) rem_address st(hex) ...", state 0A being LISTEN.
bool listening(int port) {
  for (const char* table : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::ifstream in(table);
    std::string line;
    std::getline(in, line);  // the column names
    while (std::getline(in, line)) {
      std::istringstream fields(line);
      std::string slot, local, remote, state;
      fields >> slot >> local >> remote >> state;
      const auto colon = local.rfind(':');
      if (colon != std::string::npos && state == "0A" && std::stoi(local.substr(colon + 1), nullptr, 16) == port)
        return true;
    }
  }
  return false;
}

// A rendezvous socket bound (not yet listening) to a free port and inheritable, handed to rank 0 as
// dpt-run hands it (DPT_STORE_FD): from the moment the port is chosen no other process can take it.
struct HandedPort {
  int fd;
  int port;
};
HandedPort hand_over_port() {
  const int fd = dpt::dist::net::bind_tcp(0, true);
  ::fcntl(fd, F_SETFD, 0);  // kept across exec
  return {fd, dpt::dist::net::bound_port(fd)};
}

// Rank 0 of a two-process job whose rank 1 never comes waits in the rendezvous for distributed.timeout_s
// (here 10 minutes). SIGTERM there ends it at once instead: there is nothing to save yet.
TEST(SpecialFiles, SigtermWhileWaitingForOtherRanksEndsTheTrainerAtOnce) {
  ScratchDir dir;
  const HandedPort store = hand_over_port();
  const int port = store.port;
  Child child(trainer("mlp_synthetic.yaml", {"training.device=cpu", "distributed.backend=gloo",
                                             "distributed.timeout_s=600", "checkpoint.dir=" + dir.file("run")}),
              dir.file("log"),
              {"RANK=0", "WORLD_SIZE=2", "LOCAL_RANK=0", "LOCAL_WORLD_SIZE=2", "MASTER_ADDR=127.0.0.1",
               "MASTER_PORT=" + std::to_string(port), "DPT_STORE_FD=" + std::to_string(store.fd)});
  ::close(store.fd);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!listening(port) && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_TRUE(listening(port)) << "rank 0 never hosted the rendezvous store:\n" << child.output();
  child.signal(SIGTERM);
  Finished f = child.wait(kLimit);
  ASSERT_FALSE(f.hung) << "SIGTERM did not stop a trainer waiting for its peers:\n" << f.output;
  EXPECT_EQ(f.exit_code, 128 + SIGTERM) << f.output;
  EXPECT_CONTAINS(f.output, "SIGTERM before training started: exiting");
  EXPECT_FALSE(fs::exists(dir.file("run/metrics.jsonl")));
}

// Once training runs, a first signal asks for a checkpoint after the step; a step that never ends (here:
// rank 1 is stopped, so rank 0's gradient exchange waits for distributed.timeout_s) would hold the
// trainer until then. A second signal ends it at once. (SIGINT and SIGTERM: two signals of one kind
// sent together may arrive as one.)
TEST(SpecialFiles, ASecondStopSignalEndsATrainerStuckInAStep) {
  ScratchDir dir;
  const HandedPort store = hand_over_port();
  const int port = store.port;
  const auto args =
      trainer("mlp_synthetic.yaml",
              {"training.device=cpu", "distributed.backend=gloo", "distributed.timeout_s=600", "training.steps=1000000",
               "logging.every=1", "checkpoint.every=0", "checkpoint.dir=" + dir.file("run")});
  auto env = [&](int rank) {
    return std::vector<std::string>{
        "RANK=" + std::to_string(rank), "WORLD_SIZE=2",          "LOCAL_RANK=" + std::to_string(rank),
        "LOCAL_WORLD_SIZE=2",           "MASTER_ADDR=127.0.0.1", "MASTER_PORT=" + std::to_string(port)};
  };
  std::vector<std::string> env0 = env(0);
  env0.push_back("DPT_STORE_FD=" + std::to_string(store.fd));
  Child rank0(args, dir.file("rank0.log"), env0);
  ::close(store.fd);
  Child rank1(args, dir.file("rank1.log"), env(1));
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (read_text(dir.file("run/metrics.jsonl")).find("\"step\": 3,") == std::string::npos &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_NE(read_text(dir.file("run/metrics.jsonl")).find("\"step\": 3,"), std::string::npos) << rank0.output();
  rank1.signal(SIGSTOP);
  rank0.signal(SIGINT);
  rank0.signal(SIGTERM);
  Finished f = rank0.wait(kLimit);
  rank1.signal(SIGKILL);
  rank1.signal(SIGCONT);
  rank1.wait(kLimit);
  ASSERT_FALSE(f.hung) << "a second signal did not stop a trainer stuck in a step:\n" << f.output;
  // Whichever of the two was handled second ends the process.
  EXPECT_TRUE(f.exit_code == 128 + SIGTERM || f.exit_code == 128 + SIGINT) << f.exit_code << "\n" << f.output;
  EXPECT_CONTAINS(f.output, " again: exiting now, without a checkpoint");
}

}  // namespace
