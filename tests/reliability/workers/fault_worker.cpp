// Worker of the reliability tests (tests/reliability/*_test.cpp), started by dpt-run on every rank:
//
//   dpt_test_fault_worker [--steps N] [--step-ms MS] [--timeout-ms MS] [--die-rank R] [--die-step S]
//                         [--die-how kill|exit|hang|stop|disk-full] [--die-before-join]
//                         [--until-file PATH] [--exit-delay-ms MS]
//
// Trains a small MLP with DistributedDataParallel on Gloo (CPU) for N steps, printing "step K" on each
// rank after each step, sleeping MS between steps so a test can act mid-run. With --until-file it runs
// until PATH exists instead (the ranks agree on the step to stop after). Rank R (if given) dies at
// step S: SIGKILL on itself (kill), exit(0) (exit), a stall (hang), SIGSTOP on itself (stop), or an
// error of its own: a checkpoint written to /dev/full fails with ENOSPC (disk-full). --die-before-join
// makes rank R die right after the process group's store exists but before the other ranks have joined
// (rank 0: the store's host vanishes under the others). Deaths happen on the first attempt only
// (DPT_RESTART_COUNT 0), so a group restarted by dpt-run --max-restarts runs to the end.
//
// Every survivor must leave with an error, never hang: on any exception the worker prints
// "error: <message>" to stderr, reports it to dpt-run (DPT_ERROR_FILE), waits --exit-delay-ms (a slow
// teardown, so that peers which lost it can exit first) and exits 1; a run that finishes prints
// "finished" and a parameter checksum, and exits 0. SIGTERM, as in the trainer, only sets a flag: the
// worker leaves with 128 + SIGTERM at its next step (or from its stall).
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include "collectives/process_group.h"
#include "core/error.h"
#include "core/factory.h"
#include "core/ops.h"
#include "distributed/ddp.h"
#include "layers/losses.h"
#include "layers/mlp.h"
#include "optim/adam.h"
#include "rendezvous/env.h"
#include "rendezvous/store.h"

using namespace dpt;
using namespace std::chrono_literals;

namespace {

struct Args {
  int steps = 10;
  int step_ms = 0;
  int timeout_ms = 3000;
  int die_rank = -1;
  int die_step = -1;
  std::string die_how = "kill";
  bool die_before_join = false;
  std::string until_file;
  int exit_delay_ms = 0;
};

volatile std::sig_atomic_t g_sigterm = 0;
extern "C" void on_sigterm(int) { g_sigterm = 1; }

void leave_if_asked() {
  if (g_sigterm) std::_Exit(128 + SIGTERM);
}

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    std::string k = argv[i];
    auto next = [&]() -> std::string {
      DPT_CHECK(i + 1 < argc, "{} needs a value", k);
      return argv[++i];
    };
    if (k == "--steps") a.steps = std::stoi(next());
    else if (k == "--step-ms") a.step_ms = std::stoi(next());
    else if (k == "--timeout-ms") a.timeout_ms = std::stoi(next());
    else if (k == "--die-rank") a.die_rank = std::stoi(next());
    else if (k == "--die-step") a.die_step = std::stoi(next());
    else if (k == "--die-how") a.die_how = next();
    else if (k == "--die-before-join") a.die_before_join = true;
    else if (k == "--until-file")
      a.until_file = next();
    else if (k == "--exit-delay-ms")
      a.exit_delay_ms = std::stoi(next());
    else DPT_FAIL("unknown argument '{}'", k);
  }
  return a;
}

void say(const std::string& text) {
  std::printf("%s\n", text.c_str());
  std::fflush(stdout);
}

void die(const Args& a, const dist::ProcessGroup* pg) {
  say("dying (" + a.die_how + ")");
  if (a.die_how == "kill") ::raise(SIGKILL);
  if (a.die_how == "exit") std::_Exit(0);
  if (a.die_how == "stop") {
    ::raise(SIGSTOP);
    leave_if_asked();  // continued by dpt-run along with its SIGTERM
    return;            // continued by someone else: carry on as if nothing happened
  }
  if (a.die_how == "disk-full") {
    std::ofstream out("/dev/full");
    out << std::string(1 << 16, 'x') << std::flush;
    DPT_CHECK(out.good(), "cannot write checkpoint /dev/full: {}", std::strerror(ENOSPC));
  }
  // hang: alive (its sockets stay open) but never takes part again; dpt-run or the test stops it.
  while (true) {
    leave_if_asked();
    std::this_thread::sleep_for(10ms);
  }
}

// Whether every rank should stop after this step: one rank seeing the file is enough.
bool agreed_to_stop(const Args& a, dist::ProcessGroup& pg) {
  Tensor flag = scalar_tensor(std::filesystem::exists(a.until_file) ? 1.0 : 0.0);
  pg.allreduce(flag, dist::ReduceOp::Max)->wait();
  return flag.item() > 0;
}

int run(const Args& a) {
  auto env = dist::read_dist_env();
  dist::ProcessGroupOptions options;
  options.backend = "gloo";
  options.timeout = std::chrono::milliseconds(a.timeout_ms);
  options.store_timeout = std::chrono::milliseconds(a.timeout_ms);
  bool dies_here = env.rank == a.die_rank && env.restart_count == 0;
  if (a.die_before_join && dies_here) {
    if (env.rank == 0) {
      // Host the store (the others connect to it), then vanish before the group forms.
      dist::TcpStore store(dist::tcp_store_options(env, std::chrono::milliseconds(a.timeout_ms)));
      std::this_thread::sleep_for(500ms);
    }
    die(a, nullptr);
  }
  auto pg = dist::init_process_group(env, options);
  Generator gen(7);
  auto model = std::make_shared<nn::MLP>(std::vector<int64_t>{16, 32, 32, 4}, "relu", gen);
  optim::AdamOptions o;
  o.lr = 1e-2;
  optim::AdamW opt(model->named_parameters(), o);
  dist::DistributedDataParallel ddp(model, pg);
  for (int step = 0; a.until_file.empty() ? step < a.steps : true; ++step) {
    leave_if_asked();
    if (!a.until_file.empty() && agreed_to_stop(a, *pg)) break;
    if (dies_here && step == a.die_step) die(a, pg.get());
    Generator data(100 + static_cast<uint64_t>(step) * 31 + static_cast<uint64_t>(env.rank));
    Tensor x = randn({8, 16}, data);
    Tensor y = randint({8}, 0, 4, data, TensorOptions{}.with_dtype(DType::Int64));
    opt.zero_grad();
    Tensor loss = nn::cross_entropy_loss(ddp.forward(x), y);
    loss.backward();
    opt.step();
    say("step " + std::to_string(step));
    if (a.step_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(a.step_ms));
  }
  double checksum = 0;
  for (const auto& [name, p] : model->named_parameters()) checksum += sum(p).item();
  std::printf("finished; checksum %.9g\n", checksum);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  struct sigaction action {};
  action.sa_handler = on_sigterm;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  sigaction(SIGTERM, &action, nullptr);
  Args args;
  try {
    args = parse(argc, argv);
    return run(args);
  } catch (const std::exception& e) {
    dist::report_error_to_launcher(e.what());
    std::fprintf(stderr, "error: %s\n", e.what());
    std::fflush(stderr);
    if (args.exit_delay_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(args.exit_delay_ms));
    return 1;
  }
}
