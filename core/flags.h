#pragma once
// Every environment variable dptrain reads, declared once (the table in core/flags.cpp: name, default,
// allowed values, meaning) and read through one mechanism: flag_value() / flag_choice() / flag_on().
//
// A switch is read from the environment on first use and kept for the life of the process, so a hot
// path pays one atomic load. set_flag() overrides it (tests comparing two paths, benchmarks); ScopedFlag
// does so for one scope. A value outside the allowed ones is an error naming the variable, not a
// silent default.
//
// The variables dpt-run sets for the processes it starts (rank, store, error file; rendezvous/env.h
// reads them) are a protocol rather than switches; they are listed in the same table so that every
// DPT_ name a user meets is documented in one place: docs/environment.md, generated from this table
// (dpt-train --env-reference), with a test that fails while the two disagree.
#include <optional>
#include <string>
#include <vector>

namespace dpt {

enum class Flag {
  Attention,            // DPT_ATTENTION
  LinearFused,          // DPT_LINEAR_FUSED
  LinearAbsorb,         // DPT_LINEAR_ABSORB
  GradColumnSums,       // DPT_GRAD_COLUMN_SUMS
  NoCudaMemoryCaching,  // DPT_NO_CUDA_MEMORY_CACHING
  ProfileKernels,       // DPT_PROFILE_KERNELS
  CommStreamPriority,   // DPT_COMM_STREAM_PRIORITY
  DebugCollectives,     // DPT_DEBUG_COLLECTIVES
  MemoryCheck,          // DPT_MEMORY_CHECK
  Gpt2Dir,              // DPT_GPT2_DIR
};

struct FlagSpec {
  Flag flag;
  const char* name;
  const char* fallback;              // the value when the variable is unset or empty
  std::vector<const char*> allowed;  // empty: any text (a path)
  const char* meaning;
};

// Variables set by dpt-run for its workers: name and meaning (documentation only).
struct LauncherVariable {
  const char* name;
  const char* meaning;
};

const std::vector<FlagSpec>& flag_specs();
const std::vector<LauncherVariable>& launcher_variables();

// The value in force: the override, else the environment, else the default.
std::string flag_value(Flag flag);
// For flags with allowed values: the index of the value in force in FlagSpec::allowed.
int flag_choice(Flag flag);
// For on/off flags (allowed "0", "1"): the value is "1".
bool flag_on(Flag flag);

// Overrides the value for this process (validated like the environment's); nullopt returns to the
// environment's value.
void set_flag(Flag flag, std::optional<std::string> value);

// Sets a flag for one scope and restores what was in force before, however the scope ends.
class ScopedFlag {
 public:
  ScopedFlag(Flag flag, const std::string& value);
  ~ScopedFlag();
  ScopedFlag(const ScopedFlag&) = delete;
  ScopedFlag& operator=(const ScopedFlag&) = delete;

 private:
  Flag flag_;
  std::optional<std::string> before_;
};

// Markdown: the switches, then the launcher's variables (docs/environment.md's tables).
std::string environment_reference();

}  // namespace dpt
