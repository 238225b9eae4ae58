#pragma once
// dpt-bench subcommands register themselves from their own source file:
//   DPT_BENCH_SUBCOMMAND(collectives, "collective bandwidth and latency, like nccl-tests", setup_collectives);
// so adding `dpt-bench scaling` is adding scaling.cpp, without touching main.cpp. The setup function
// adds the subcommand's options (and examples) to its CLI11 app and returns what runs it once they are
// parsed, so that `dpt-bench NAME --help` shows them and a mistyped one is refused before anything runs.
#include <CLI/CLI.hpp>
#include <functional>
#include <map>
#include <string>

namespace dpt::bench {

// Runs the subcommand with the options parsed; returns the process exit code.
using SubcommandRun = std::function<int()>;
using SubcommandSetup = std::function<SubcommandRun(CLI::App& app)>;

struct Subcommand {
  std::string help;
  SubcommandSetup setup;
};

std::map<std::string, Subcommand>& subcommands();

struct SubcommandRegistrar {
  SubcommandRegistrar(const std::string& name, const std::string& help, SubcommandSetup setup) {
    subcommands()[name] = Subcommand{help, std::move(setup)};
  }
};

}  // namespace dpt::bench

#define DPT_BENCH_SUBCOMMAND(name, help, setup) \
  static ::dpt::bench::SubcommandRegistrar dpt_bench_registrar_##name(#name, help, setup)
