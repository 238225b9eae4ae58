#include "stop_signal.h"

#include <csignal>

namespace dpt::train {

namespace {
volatile std::sig_atomic_t g_signal = 0;

extern "C" void on_stop_signal(int signo) {
  if (g_signal == 0) g_signal = signo;
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

int stop_signal() { return g_signal; }

}  // namespace dpt::train
