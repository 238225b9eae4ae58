#pragma once
// SIGINT / SIGTERM ask the trainer to stop: the handler only records the signal; the training loop
// notices it between steps, agrees with the other ranks on the step to stop after (so every rank
// issues the same collectives), writes a checkpoint and exits with 128 + the signal number.
namespace dpt::train {

void install_stop_handlers();
int stop_signal();  // the first SIGINT/SIGTERM received, or 0

}  // namespace dpt::train
