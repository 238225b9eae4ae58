#pragma once
// How the multi-process tests name their worker binary on a dpt-run command line.
//
// DPT_TEST_WORKER_PREFIX, when set, goes in front of the worker: scripts/gpu-sanitize.sh puts
// compute-sanitizer there, so that every worker runs under its own memcheck instance. One instance
// following the whole tree (the test executable, dpt-run and both NCCL workers) never finished the
// first 2-GPU DDP test, while one instance per worker checks the same pair of workers in ~30 s.
#include <cstdlib>
#include <string>

inline std::string worker_command(const std::string& worker) {
  const char* prefix = std::getenv("DPT_TEST_WORKER_PREFIX");
  return prefix && *prefix ? std::string(prefix) + " " + worker : worker;
}
