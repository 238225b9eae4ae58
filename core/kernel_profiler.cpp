#include "core/kernel_profiler.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <vector>

#include "core/cuda_runtime.h"
#include "core/flags.h"

namespace dpt {

namespace {

struct Totals {
  std::mutex mutex;
  std::map<std::string, std::pair<double, long>> by_name;  // seconds, calls

  ~Totals() {
    if (by_name.empty()) return;
    std::vector<std::pair<std::string, std::pair<double, long>>> rows(by_name.begin(), by_name.end());
    std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.second.first > b.second.first; });
    double total = 0;
    for (const auto& r : rows) total += r.second.first;
    std::fprintf(stderr, "\nkernel profile (synchronised; %.1f ms in all)\n%-28s %10s %8s %6s\n", total * 1e3, "kernel",
                 "ms", "calls", "share");
    for (const auto& [name, v] : rows) {
      std::fprintf(stderr, "%-28s %10.2f %8ld %5.1f%%\n", name.c_str(), v.first * 1e3, v.second,
                   100.0 * v.first / total);
    }
  }
};

Totals& totals() {
  static Totals t;
  return t;
}

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

}  // namespace

bool KernelTimer::enabled() {
  static const bool on = flag_on(Flag::ProfileKernels);
  return on;
}

KernelTimer::KernelTimer(const char* name, bool on_cuda) {
  if (!enabled()) return;
  if (on_cuda) cuda::synchronize();
  name_ = on_cuda ? name : nullptr;
  start_ = now();
}

KernelTimer::~KernelTimer() {
  if (!name_) return;
  cuda::synchronize();
  double elapsed = now() - start_;
  std::lock_guard<std::mutex> lock(totals().mutex);
  auto& entry = totals().by_name[name_];
  entry.first += elapsed;
  entry.second += 1;
}

}  // namespace dpt
