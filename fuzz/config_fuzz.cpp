// libFuzzer target: the trainer's config loader (YAML text plus --set overrides) on arbitrary bytes.
// The input up to the first 0x01 byte is the YAML; each later 0x01-separated piece is one override.
// Files and devices are not checked (no file system or GPU state in the fuzzed outcome). Anything but
// a ConfigError or a loaded config is a finding; a loaded config must also survive to_yaml and load
// back (the resolved config written beside checkpoints is read by resume).
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "config.h"
#include "core/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string input(reinterpret_cast<const char*>(data), size);
  std::vector<std::string> pieces;
  size_t begin = 0;
  for (size_t at; (at = input.find('\x01', begin)) != std::string::npos; begin = at + 1)
    pieces.push_back(input.substr(begin, at - begin));
  pieces.push_back(input.substr(begin));
  std::string yaml = pieces.front();
  std::vector<std::string> overrides(pieces.begin() + 1, pieces.end());
  const dpt::train::LoadOptions options{.check_files = false, .check_device = false};
  dpt::train::Config config;
  try {
    config = dpt::train::load_config_text(yaml, "fuzz.yaml", overrides, options);
  } catch (const dpt::train::ConfigError&) {
    return 0;
  }
  // A config that loaded must round-trip through its resolved YAML.
  dpt::train::load_config_text(dpt::train::to_yaml(config), "resolved.yaml", {}, options);
  return 0;
}
