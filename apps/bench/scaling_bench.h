#pragma once
// `dpt-bench scaling`: runs `dpt-bench train` for one workload at 1..N GPUs (each through dpt-run),
// weak (fixed per-GPU batch) scaling, plus a sweep over bucket_cap_mb at N GPUs, and reports
// throughput, speedup, efficiency, compute time, communication time, exposed communication and the
// comm/compute ratio. Writes CSV, a Markdown table and (with gnuplot) a PNG plot, and compares the
// measurements with a step-time model (measured compute + alpha-beta ring AllReduce, see
// scaling_model.h) that then predicts larger GPU counts.
#include "subcommand.h"

namespace dpt::bench {

// Adds the subcommand's options to `app`; returns what runs it.
SubcommandRun setup_scaling_bench(CLI::App& app);

}  // namespace dpt::bench
