// dpt-bench <subcommand> [options]: the project's benchmarks, one file per subcommand.
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>

#include "scaling_bench.h"
#include "train_bench.h"

namespace {

struct Subcommand {
  const char* name;
  int (*run)(int argc, char** argv);
  const char* help;
};

const Subcommand kSubcommands[] = {
    {"train", dpt::bench::run_train_bench, "train a benchmark workload for N steps: tokens/s, step time, MFU, memory"},
    {"scaling", dpt::bench::run_scaling_bench, "weak scaling at 1..N GPUs, bucket sweep, step-time model, CSV/MD/PNG"},
};

void usage() {
  std::fprintf(stderr, "usage: dpt-bench <subcommand> [options]\n");
  for (const auto& s : kSubcommands) std::fprintf(stderr, "  %-12s %s\n", s.name, s.help);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h")) {
    usage();
    return argc < 2 ? 2 : 0;
  }
  for (const auto& s : kSubcommands) {
    if (std::string(argv[1]) != s.name) continue;
    try {
      return s.run(argc - 2, argv + 2);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "dpt-bench %s: error: %s\n", s.name, e.what());
      return 1;
    }
  }
  std::fprintf(stderr, "dpt-bench: unknown subcommand '%s'\n", argv[1]);
  usage();
  return 2;
}
