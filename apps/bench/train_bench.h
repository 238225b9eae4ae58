#pragma once
// `dpt-bench train`: the benchmark workloads of the project (GPT-2 124M, the ~92M MLP, the tiny GPT),
// trained for a fixed number of steps on random data, one process per GPU (launch through dpt-run for
// several). Prints tokens/s (or samples/s), median step time, MFU and peak memory, as
// bench/pytorch_reference.py does for PyTorch, and a JSON line for scripts.
#include "subcommand.h"

namespace dpt::bench {

// Adds the subcommand's options to `app`; returns what runs it.
SubcommandRun setup_train_bench(CLI::App& app);

}  // namespace dpt::bench
