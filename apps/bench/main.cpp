// dpt-bench SUBCOMMAND [options]: the project's benchmarks, one subcommand per source file here.
#include <cstdio>
#include <exception>
#include <string>

#include "subcommand.h"

namespace dpt::bench {

std::map<std::string, Subcommand>& subcommands() {
  static std::map<std::string, Subcommand> table;
  return table;
}

}  // namespace dpt::bench

int main(int argc, char** argv) {
  auto& table = dpt::bench::subcommands();
  auto usage = [&](FILE* out) {
    std::fprintf(out, "usage: dpt-bench SUBCOMMAND [options]   (SUBCOMMAND --help for its options)\n");
    for (const auto& [name, sub] : table) std::fprintf(out, "  %-14s %s\n", name.c_str(), sub.help.c_str());
  };
  if (argc < 2 || std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h") {
    usage(argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  auto it = table.find(argv[1]);
  if (it == table.end()) {
    std::fprintf(stderr, "dpt-bench: unknown subcommand '%s'\n", argv[1]);
    usage(stderr);
    return 2;
  }
  try {
    return it->second.run(argc - 1, argv + 1);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dpt-bench %s: error: %s\n", argv[1], e.what());
    return 1;
  }
}
