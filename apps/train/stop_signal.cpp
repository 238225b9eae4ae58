#include "stop_signal.h"

#include <unistd.h>

#include <csignal>
#include <cstring>

namespace dpt::train {

namespace {
volatile std::sig_atomic_t g_signal = 0;
volatile std::sig_atomic_t g_deferred = 0;

// Only async-signal-safe calls here: write(2) and _exit(2).
void say(const char* text) {
  const ssize_t ignored = ::write(STDERR_FILENO, text, std::strlen(text));
  (void)ignored;
}

extern "C" void on_stop_signal(int signo) {
  if (g_deferred && g_signal == 0) {
    g_signal = signo;
    return;
  }
  const char* name = signo == SIGINT ? "SIGINT" : "SIGTERM";
  say("dpt-train: ");
  say(name);
  say(g_deferred ? " again: exiting now, without a checkpoint\n" : " before training started: exiting\n");
  ::_exit(128 + signo);
}
}  // namespace

void install_stop_handlers() {
  struct sigaction action {};
  action.sa_handler = on_stop_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;  // a blocking read or collective continues; the loop checks between steps
  sigaction(SIGINT, &action, nullptr);
  sigaction(SIGTERM, &action, nullptr);
  // A launcher may start us with these blocked (it blocks signals across fork): make sure they arrive.
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_UNBLOCK, &set, nullptr);
}

void defer_stop_signals() { g_deferred = 1; }

int stop_signal() { return g_signal; }

}  // namespace dpt::train
