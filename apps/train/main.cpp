// dpt-train: trains the model a YAML config describes, on the CPU, one GPU, or one process per GPU
// under dpt-run (or srun / mpirun).
//   dpt-train --config configs/mlp_synthetic.yaml [--set key.path=value ...] [key.path=value ...]
//   dpt-train --config FILE --print-config     (the resolved config, every key)
//   dpt-train --config-reference               (every key, its type, default and meaning)
//   dpt-train --config FILE --multirun optim.lr=0.01,0.003 [key=a,b ...]   (every combination, multirun.h)
//   dpt-train --env-reference                  (every environment variable dptrain reads)
// Exit codes: 0 done; 1 error (one message on stderr, nothing overwritten); 2 usage; 128 + signal when
// SIGINT/SIGTERM stopped the run after a checkpoint, or before training began (a rendezvous still
// waiting for peers gives way within a second).
#include <spdlog/spdlog.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include "command_line.h"
#include "config.h"
#include "core/flags.h"
#include "multirun.h"
#include "rendezvous/env.h"
#include "rendezvous/socket.h"
#include "stop_signal.h"
#include "trainer.h"

namespace {

// Rank 0 logs at the configured level; the others only warnings and errors. Every line names the rank
// when there are several.
void setup_logging(const dpt::train::Config& config, const dpt::dist::DistEnv& env) {
  const std::string rank = env.world_size > 1 ? fmt::format(" rank {}", env.rank) : "";
  spdlog::set_pattern(fmt::format("[%H:%M:%S{}] %^%v%$", rank));
  spdlog::level::level_enum level = spdlog::level::from_str(config.logging.level);
  if (env.rank != 0 && level < spdlog::level::warn) level = spdlog::level::warn;
  spdlog::set_level(level);
}

// This program's own path, for --multirun's child runs.
std::string self_path(const char* argv0) {
  std::error_code ec;
  const auto path = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::string(argv0) : path.string();
}

// The command line's overrides, --set ones and bare ones, in the order given: a later one wins.
std::vector<std::string> overrides_in_order(const CLI::App& app, const CLI::Option* set, const CLI::Option* bare) {
  std::vector<std::string> out;
  size_t next_set = 0, next_bare = 0;
  for (const CLI::Option* option : app.parse_order()) {
    if (option == set) out.push_back(set->results()[next_set++]);
    if (option == bare) out.push_back(bare->results()[next_bare++]);
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  std::string config_path;
  bool print_config = false;
  bool config_reference = false;
  bool env_reference = false;
  bool sweep = false;
  CLI::App app{"Trains the model a YAML config describes, on the CPU, one GPU, or one process per GPU under dpt-run.",
               "dpt-train"};
  app.add_option("--config,-c", config_path, "the run's YAML config");
  std::vector<std::string> set_overrides, bare_overrides;  // in order, from overrides_in_order
  CLI::Option* set =
      app.add_option("--set", set_overrides, "override one key: key.path=value (Hydra: +key adds, ++key sets)")
          ->type_name("KEY=VALUE")
          ->allow_extra_args(false);
  CLI::Option* bare =
      app.add_option("overrides", bare_overrides, "the same as --set, Hydra style: key.path=value, +key=v, ++key=v")
          ->type_name("KEY=VALUE");
  app.add_flag("--print-config", print_config, "print the resolved config, every key, and exit");
  app.add_flag("--config-reference", config_reference, "print every key, its type, default and meaning, and exit");
  app.add_flag("--env-reference", env_reference, "print every environment variable dptrain reads, and exit");
  app.add_flag("--multirun,-m", sweep,
               "run every combination of the overrides that list several values (optim.lr=0.01,0.003), each in "
               "<checkpoint.dir>/multirun/<key>_<value>..., and write summary.md and summary.csv there")
      ->excludes("--print-config");
  dpt::cli::set_examples(
      app, {"dpt-train --config configs/mlp_synthetic.yaml",
            "dpt-train -c configs/char_gpt.yaml training.steps=200 --set optim.lr=1e-3",
            "dpt-train -c configs/mlp_synthetic.yaml --multirun optim.lr=0.01,0.003 training.batch_size=32,64"});
  if (auto code = dpt::cli::parse(app, argc, argv)) return *code;
  if (config_reference) {
    std::cout << dpt::train::config_reference();
    return 0;
  }
  if (env_reference) {
    std::cout << dpt::environment_reference();
    return 0;
  }
  if (config_path.empty()) dpt::cli::usage_error("dpt-train", "--config is required");
  // A bare argument is an override only with its '=': anything else is a mistyped option or file.
  for (const std::string& text : bare_overrides) {
    if (text.find('=') == std::string::npos)
      dpt::cli::usage_error("dpt-train", "'" + text + "' is not an option or an override key.path=value");
  }
  const std::vector<std::string> overrides = overrides_in_order(app, set, bare);
  if (sweep) {
    try {
      return dpt::train::multirun(self_path(argv[0]), config_path, overrides);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "dpt-train --multirun: error: %s\n", e.what());
      return 1;
    }
  }
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
