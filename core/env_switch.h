#pragma once
// A process-wide on/off switch for a fast path: the value a setter gave, else an environment variable read
// on first use (unset or anything but "0" is on). The variable lets a user or a benchmark compare paths
// without rebuilding; the setter lets a test flip it for one scope (tests/linear_switches.h).
#include <atomic>
#include <cstdlib>
#include <cstring>

namespace dpt {

class EnvSwitch {
 public:
  explicit constexpr EnvSwitch(const char* variable) : variable_(variable) {}

  void set(bool on) { override_.store(on ? 1 : 0, std::memory_order_relaxed); }

  bool on() const {
    const int o = override_.load(std::memory_order_relaxed);
    if (o >= 0) return o == 1;
    int e = from_environment_.load(std::memory_order_relaxed);
    if (e < 0) {  // two threads reading it at once store the same value
      const char* v = std::getenv(variable_);
      e = v != nullptr && std::strcmp(v, "0") == 0 ? 0 : 1;
      from_environment_.store(e, std::memory_order_relaxed);
    }
    return e == 1;
  }

 private:
  const char* variable_;
  std::atomic<int> override_{-1};                  // -1: the environment decides
  mutable std::atomic<int> from_environment_{-1};  // -1: not read yet
};

}  // namespace dpt
