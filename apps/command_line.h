#pragma once
// What every dptrain program's command line has in common (CLI11): a short description and a few
// examples under --help; exit code 0 after --help and 2 after a usage error, with CLI11's message on
// stderr naming the option and the value it refused. CLI11 converts numbers strictly: an integer option
// refuses "1e3", "12x" and "3.0", a float option refuses "abc"; number_in and at_least also refuse nan and inf.
#include <spdlog/fmt/fmt.h>

#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdio>
#include <initializer_list>
#include <optional>
#include <string>

namespace dpt::cli {

constexpr int kUsageError = 2;

// "Examples:" and one command per line, under the options in --help.
inline void set_examples(CLI::App& app, std::initializer_list<const char*> commands) {
  std::string footer = "Examples:";
  for (const char* command : commands) footer += std::string("\n  ") + command;
  app.footer(footer);
}

// Parses the command line into `app`. Nothing when the program should go on; else its exit code: 0
// after --help (printed on stdout), kUsageError after a usage error (printed on stderr).
inline std::optional<int> parse(CLI::App& app, int argc, char** argv) {
  try {
    app.parse(argc, argv);
    return std::nullopt;
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : kUsageError;
  }
}

// A usage error found after parsing (a value that depends on another option): the message and CLI11's
// hint on stderr, exit code kUsageError.
[[noreturn]] inline void usage_error(const std::string& program, const std::string& message) {
  std::fprintf(stderr, "%s: %s\nRun with --help for more information.\n", program.c_str(), message.c_str());
  std::exit(kUsageError);
}

// A number in [min, max], nan and inf refused (a float option takes them from CLI11 otherwise).
inline CLI::Validator number_in(double min, double max) {
  return CLI::Validator(
      [min, max](std::string& text) {
        double value = 0;
        if (!CLI::detail::lexical_cast(text, value) || !std::isfinite(value)) return "'" + text + "' is not a number";
        if (value < min || value > max) return fmt::format("{} is outside [{}, {}]", text, min, max);
        return std::string();
      },
      fmt::format("in [{}, {}]", min, max));
}

// A number >= min, nan and inf refused. (CLI11's NonNegativeNumber and PositiveNumber answer "abc" with
// the range of a double.)
inline CLI::Validator at_least(double min) {
  return CLI::Validator(
      [min](std::string& text) {
        double value = 0;
        if (!CLI::detail::lexical_cast(text, value) || !std::isfinite(value)) return "'" + text + "' is not a number";
        return value < min ? fmt::format("{} is below {}", text, min) : std::string();
      },
      fmt::format(">= {}", min));
}

}  // namespace dpt::cli
