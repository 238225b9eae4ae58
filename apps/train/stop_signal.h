#pragma once
// SIGINT / SIGTERM ask the trainer to stop, in one of two ways:
//   - during setup (from install_stop_handlers until defer_stop_signals), the process exits at once with
//     128 + the signal number. Setup has nothing to save, writes only by atomic renames, and may be
//     waiting for long (a rendezvous with ranks that never come, a slow read): it must not make the
//     user wait for it.
//   - once training can stop cleanly (defer_stop_signals), the handler only records the signal; the
//     training loop notices it between steps, agrees with the other ranks on the step to stop after (so
//     every rank issues the same collectives), writes a checkpoint and exits with 128 + the signal
//     number. A second signal then exits at once, without a checkpoint: the way out of a step that
//     never ends.
namespace dpt::train {

void install_stop_handlers();
void defer_stop_signals();  // from now on the training loop handles the first signal
int stop_signal();          // the first SIGINT/SIGTERM received after defer_stop_signals, or 0

}  // namespace dpt::train
