#pragma once
// dpt-bench subcommands register themselves from their own source file:
//   DPT_BENCH_SUBCOMMAND(collectives, "collective bandwidth and latency, like nccl-tests", run_collectives);
// so adding `dpt-bench scaling` is adding scaling.cpp, without touching main.cpp.
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace dpt::bench {

// argv[0] is the subcommand's name; returns the process exit code.
using SubcommandFn = std::function<int(int argc, char** argv)>;

struct Subcommand {
  std::string help;
  SubcommandFn run;
};

std::map<std::string, Subcommand>& subcommands();

struct SubcommandRegistrar {
  SubcommandRegistrar(const std::string& name, const std::string& help, SubcommandFn fn) {
    subcommands()[name] = Subcommand{help, std::move(fn)};
  }
};

}  // namespace dpt::bench

#define DPT_BENCH_SUBCOMMAND(name, help, fn) \
  static ::dpt::bench::SubcommandRegistrar dpt_bench_registrar_##name(#name, help, fn)
