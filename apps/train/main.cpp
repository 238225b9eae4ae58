// dpt-train: trains the model a YAML config describes, on the CPU, one GPU, or one process per GPU
// under dpt-run (or srun / mpirun).
//   dpt-train --config configs/mlp_synthetic.yaml [--set key.path=value ...]
//   dpt-train --config FILE --print-config     (the resolved config, every key)
//   dpt-train --config-reference               (every key, its type, default and meaning)
//   dpt-train --env-reference                  (every environment variable dptrain reads)
// Exit codes: 0 done; 1 error (one message on stderr, nothing overwritten); 2 usage; 128 + signal when
// SIGINT/SIGTERM stopped the run after a checkpoint, or before training began (a rendezvous still
// waiting for peers gives way within a second).
#include <spdlog/spdlog.h>

#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "config.h"
#include "core/flags.h"
#include "distributed/env.h"
#include "distributed/socket.h"
#include "stop_signal.h"
#include "trainer.h"

namespace {

int usage(const char* program, int code) {
  std::fprintf(code == 0 ? stdout : stderr,
               "usage: %s --config FILE.yaml [--set key.path=value ...] [--print-config]\n"
               "       %s --config-reference   (every key, its type, default and meaning)\n"
               "       %s --env-reference      (every environment variable dptrain reads)\n",
               program, program, program);
  return code;
}

// Rank 0 logs at the configured level; the others only warnings and errors. Every line names the rank
// when there are several.
void setup_logging(const dpt::train::Config& config, const dpt::dist::DistEnv& env) {
  const std::string rank = env.world_size > 1 ? fmt::format(" rank {}", env.rank) : "";
  spdlog::set_pattern(fmt::format("[%H:%M:%S{}] %^%v%$", rank));
  spdlog::level::level_enum level = spdlog::level::from_str(config.logging.level);
  if (env.rank != 0 && level < spdlog::level::warn) level = spdlog::level::warn;
  spdlog::set_level(level);
}

}  // namespace

int main(int argc, char** argv) {
  std::string config_path;
  std::vector<std::string> overrides;
  bool print_config = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&](const char* flag) -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "dpt-train: %s needs a value\n", flag);
        std::exit(usage(argv[0], 2));
      }
      return argv[++i];
    };
    if (arg == "--config" || arg == "-c") {
      config_path = value("--config");
    } else if (arg.rfind("--config=", 0) == 0) {
      config_path = arg.substr(9);
    } else if (arg == "--set") {
      overrides.push_back(value("--set"));
    } else if (arg.rfind("--set=", 0) == 0) {
      overrides.push_back(arg.substr(6));
    } else if (arg == "--print-config") {
      print_config = true;
    } else if (arg == "--config-reference") {
      std::cout << dpt::train::config_reference();
      return 0;
    } else if (arg == "--env-reference") {
      std::cout << dpt::environment_reference();
      return 0;
    } else if (arg == "--help" || arg == "-h") {
      return usage(argv[0], 0);
    } else if (arg.find('=') != std::string::npos && arg.rfind("-", 0) != 0) {
      overrides.push_back(arg);  // Hydra style: bare key.path=value
    } else {
      std::fprintf(stderr, "dpt-train: unknown argument '%s'\n", arg.c_str());
      return usage(argv[0], 2);
    }
  }
  if (config_path.empty()) return usage(argv[0], 2);
  int rank = 0;
  try {
    dpt::train::Config config = dpt::train::load_config(config_path, overrides);
    if (print_config) {
      std::cout << dpt::train::to_yaml(config);
      return 0;
    }
    const dpt::dist::DistEnv env = dpt::dist::read_dist_env();
    rank = env.rank;
    setup_logging(config, env);
    dpt::train::install_stop_handlers();
    dpt::dist::set_stop_check(&dpt::train::stop_signal);  // a rendezvous waiting for peers gives way to it
    dpt::train::Trainer trainer(std::move(config));
    return trainer.run();
  } catch (const std::exception& e) {
    std::fflush(stdout);
    const std::string who = rank > 0 ? fmt::format(" (rank {})", rank) : "";
    // Asked to stop while waiting for peers: a stop like one between steps, not a failure.
    if (const auto* stop = dynamic_cast<const dpt::dist::InterruptedError*>(&e)) {
      std::fprintf(stderr, "dpt-train%s: stopped: %s\n", who.c_str(), e.what());
      return 128 + stop->signal;
    }
    dpt::dist::report_error_to_launcher(e.what());
    std::fprintf(stderr, "dpt-train%s: error: %s\n", who.c_str(), e.what());
    return 1;
  }
}
