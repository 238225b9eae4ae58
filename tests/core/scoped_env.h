#pragma once
// Sets an environment variable for one scope, restoring the previous value after: the CUDA attention
// kernels read DPT_FLASH_IMPL and DPT_FLASH_MMA_WARPS per call, so a test can compare implementations.
#include <cstdlib>
#include <string>

namespace dpt {

class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    const char* old = std::getenv(name);
    had_ = old != nullptr;
    if (had_) old_ = old;
    ::setenv(name, value, 1);
  }
  ~ScopedEnv() {
    if (had_) {
      ::setenv(name_, old_.c_str(), 1);
    } else {
      ::unsetenv(name_);
    }
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  bool had_ = false;
  std::string old_;
};

}  // namespace dpt
