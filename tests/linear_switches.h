#pragma once
// The process-wide switches of dpt::linear (core/ops.h), set for one test and restored however the test
// ends, so a test that compares the fused and the composed paths leaves the next test unaffected. (The
// attention path is a flag: ScopedFlag(Flag::Attention, ...), core/flags.h.)
#include "core/grad_column_sums.h"
#include "core/ops.h"

namespace dpt {

// Sets a switch read through get() and written through set() to `value` for the scope's lifetime.
template <class T>
class ScopedSwitch {
 public:
  ScopedSwitch(T (*get)(), void (*set)(T), T value) : set_(set), before_(get()) { set_(value); }
  ~ScopedSwitch() { set_(before_); }
  ScopedSwitch(const ScopedSwitch&) = delete;
  ScopedSwitch& operator=(const ScopedSwitch&) = delete;

 private:
  void (*set_)(T);
  T before_;
};

// Fused CUDA path of dpt::linear on or off (set_linear_fused).
class FusedSwitch : public ScopedSwitch<bool> {
 public:
  explicit FusedSwitch(bool on) : ScopedSwitch(linear_fused, set_linear_fused, on) {}
};

// A ReLU linear's backward absorbed by the linear it feeds, on or off (set_linear_absorb).
class AbsorbSwitch : public ScopedSwitch<bool> {
 public:
  explicit AbsorbSwitch(bool on) : ScopedSwitch(linear_absorb, set_linear_absorb, on) {}
};

// Column-sum handoff from a linear's consumer to its bias gradient on or off (set_grad_column_sums).
class ColumnSumsSwitch : public ScopedSwitch<bool> {
 public:
  explicit ColumnSumsSwitch(bool on) : ScopedSwitch(grad_column_sums_enabled, set_grad_column_sums, on) {}
};

}  // namespace dpt
