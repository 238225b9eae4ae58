#pragma once
// Helpers shared by the dpt-bench subcommands.
#include <functional>
#include <string>
#include <vector>

#include "core/device.h"

namespace dpt::bench {

// Median milliseconds of `iters` runs of `run` after `warmup` untimed ones. On a GPU each run is
// bracketed by its own pair of CUDA events on the current stream (GPU time, no host sync between runs);
// on the CPU by the steady clock.
double median_ms(int warmup, int iters, const Device& device, const std::function<void()>& run);

}  // namespace dpt::bench
