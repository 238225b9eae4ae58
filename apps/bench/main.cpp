// dpt-bench SUBCOMMAND [options]: the project's benchmarks, one subcommand per source file here.
#include <cstdio>
#include <exception>
#include <map>
#include <string>

#include "command_line.h"
#include "subcommand.h"

namespace dpt::bench {

std::map<std::string, Subcommand>& subcommands() {
  static std::map<std::string, Subcommand> table;
  return table;
}

}  // namespace dpt::bench

int main(int argc, char** argv) {
  CLI::App app{"The project's benchmarks: training throughput, scaling over GPUs, collectives and kernels.",
               "dpt-bench"};
  app.require_subcommand(1);
  std::map<const CLI::App*, dpt::bench::SubcommandRun> runs;
  for (const auto& [name, sub] : dpt::bench::subcommands()) {
    CLI::App* command = app.add_subcommand(name, sub.help);
    runs[command] = sub.setup(*command);
  }
  dpt::cli::set_examples(app, {"dpt-bench train --workload tiny_gpt --steps 30", "dpt-bench scaling --help",
                               "dpt-run --nproc-per-node 2 -- dpt-bench collectives --backend nccl"});
  if (auto code = dpt::cli::parse(app, argc, argv)) return *code;
  const CLI::App* chosen = app.get_subcommands().front();
  try {
    return runs.at(chosen)();
  } catch (const std::exception& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "dpt-bench %s: error: %s\n", chosen->get_name().c_str(), e.what());
    return 1;
  }
}
