#pragma once
// Errors are exceptions that say what was expected, what was found, and where (file:line).
#include <spdlog/fmt/fmt.h>

#include <stdexcept>
#include <string>

namespace dpt {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

[[noreturn]] void throw_error(const char* file, int line, const std::string& message);

}  // namespace dpt

// DPT_CHECK(condition, "format {}", args...): throws dpt::Error with the formatted message and file:line.
#define DPT_CHECK(cond, ...)                                                  \
  do {                                                                        \
    if (!(cond)) ::dpt::throw_error(__FILE__, __LINE__, fmt::format(__VA_ARGS__)); \
  } while (0)

#define DPT_FAIL(...) ::dpt::throw_error(__FILE__, __LINE__, fmt::format(__VA_ARGS__))
