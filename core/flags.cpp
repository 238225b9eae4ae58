#include "core/flags.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "core/error.h"

namespace dpt {

namespace {

// The one list. Order = enum order (checked at first use).
const std::vector<FlagSpec> kFlags = {
    {Flag::Attention,
     "DPT_ATTENTION",
     "auto",
     {"auto", "flash", "reference"},
     "causal attention on CUDA: auto = cuDNN's fused engine where it has one for the shape, dptrain's flash "
     "kernels otherwise; flash = dptrain's kernels only; reference = the composed matmul, softmax, matmul "
     "(scores in memory), for comparison"},
    {Flag::LinearFused,
     "DPT_LINEAR_FUSED",
     "1",
     {"0", "1"},
     "1: Linear layers on CUDA run cuBLASLt with the bias and activation in the GEMM epilogue; 0: separate "
     "kernels (for comparison)"},
    {Flag::LinearAbsorb,
     "DPT_LINEAR_ABSORB",
     "1",
     {"0", "1"},
     "1: on CUDA, a Linear fed by a Linear with ReLU forms that ReLU's backward and bias gradient in its "
     "input-gradient GEMM's epilogue; 0: separate passes (for comparison)"},
    {Flag::GradColumnSums,
     "DPT_GRAD_COLUMN_SUMS",
     "1",
     {"0", "1"},
     "1: a kernel that already reads a gradient also sums its columns for the producing Linear's bias "
     "gradient; 0: the Linear sums them itself"},
    {Flag::NoCudaMemoryCaching,
     "DPT_NO_CUDA_MEMORY_CACHING",
     "0",
     {"0", "1"},
     "1: every CUDA allocation goes to cudaMalloc and every free to cudaFree (for compute-sanitizer)"},
    {Flag::ProfileKernels,
     "DPT_PROFILE_KERNELS",
     "0",
     {"0", "1"},
     "1: each op synchronises the device and its time is logged per kernel name (slow; for profiling)"},
    {Flag::CommStreamPriority,
     "DPT_COMM_STREAM_PRIORITY",
     "high",
     {"high", "normal"},
     "priority of the NCCL communication stream: high lets a collective launched during backward start "
     "ahead of queued compute blocks"},
    {Flag::DebugCollectives,
     "DPT_DEBUG_COLLECTIVES",
     "0",
     {"0", "1"},
     "1: before each collective all ranks check through the store that they run the same op, count and "
     "dtype, and the first divergence is reported instead of a hang (distributed.debug_checks)"},
    {Flag::MemoryCheck,
     "DPT_MEMORY_CHECK",
     "1",
     {"0", "1"},
     "1: dpt-train refuses a run whose estimated memory exceeds what the device or host has free"},
    {Flag::Gpt2Dir,
     "DPT_GPT2_DIR",
     "",
     {},
     "directory with GPT-2's encoder.json and vocab.bpe; empty: the copy installed with dptrain"},
};

const std::vector<LauncherVariable> kLauncherVariables = {
    {"RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT",
     "the process's place in the job and the rendezvous address, as torchrun sets them"},
    {"DPT_JOB_ID", "the job's identity; a store refuses peers of another job"},
    {"DPT_STORE_FD", "the listening socket dpt-run bound for rank 0's rendezvous store"},
    {"DPT_ERROR_FILE", "where a failing worker writes its error, for dpt-run's root-cause report"},
    {"DPT_HEARTBEAT_FILE", "the file a worker touches while alive, for dpt-run's hang detection"},
    {"DPT_RESTART_COUNT, DPT_MAX_RESTARTS", "which attempt of the group this is, and how many dpt-run allows"},
};

constexpr size_t kCount = static_cast<size_t>(Flag::Gpt2Dir) + 1;

// Per flag: the environment's value, read once; the override, if any. Choice flags keep indices in
// atomics (hot paths read them); text flags keep their text under the mutex.
struct State {
  std::once_flag read;
  std::string environment;
  std::atomic<int> environment_choice{-1};
  std::atomic<int> override_choice{-1};  // -1: none
  std::optional<std::string> override_text;
};

std::array<State, kCount>& states() {
  static std::array<State, kCount> s;
  return s;
}

std::mutex& text_mutex() {
  static std::mutex m;
  return m;
}

const FlagSpec& spec(Flag flag) {
  const FlagSpec& s = kFlags.at(static_cast<size_t>(flag));
  DPT_CHECK(s.flag == flag, "flags: the table in core/flags.cpp is out of enum order at {}", s.name);
  return s;
}

int choice_index(const FlagSpec& s, const std::string& value, const char* source) {
  for (size_t i = 0; i < s.allowed.size(); ++i) {
    if (value == s.allowed[i]) return static_cast<int>(i);
  }
  std::string allowed;
  for (const char* a : s.allowed) allowed += fmt::format("{}{}", allowed.empty() ? "" : ", ", a);
  DPT_FAIL("{} {}: expected one of {}, found '{}'", source, s.name, allowed, value);
}

State& read_environment(Flag flag) {
  State& st = states()[static_cast<size_t>(flag)];
  std::call_once(st.read, [&] {
    const FlagSpec& s = spec(flag);
    const char* v = std::getenv(s.name);
    st.environment = v != nullptr && *v != '\0' ? v : s.fallback;
    if (!s.allowed.empty()) st.environment_choice = choice_index(s, st.environment, "environment variable");
  });
  return st;
}

std::optional<std::string> current_override(Flag flag) {
  const FlagSpec& s = spec(flag);
  State& st = states()[static_cast<size_t>(flag)];
  if (!s.allowed.empty()) {
    const int o = st.override_choice.load(std::memory_order_relaxed);
    return o < 0 ? std::nullopt : std::optional<std::string>(s.allowed[static_cast<size_t>(o)]);
  }
  std::lock_guard<std::mutex> lock(text_mutex());
  return st.override_text;
}

std::string markdown_cell(std::string text) {
  std::string out;
  for (char c : text) out += c == '|' ? std::string("\\|") : std::string(1, c);
  return out;
}

}  // namespace

const std::vector<FlagSpec>& flag_specs() { return kFlags; }
const std::vector<LauncherVariable>& launcher_variables() { return kLauncherVariables; }

int flag_choice(Flag flag) {
  State& st = states()[static_cast<size_t>(flag)];
  const int o = st.override_choice.load(std::memory_order_relaxed);
  if (o >= 0) return o;
  const int e = read_environment(flag).environment_choice.load(std::memory_order_relaxed);
  DPT_CHECK(e >= 0, "flags: {} takes any text; read it with flag_value", spec(flag).name);
  return e;
}

std::string flag_value(Flag flag) {
  const FlagSpec& s = spec(flag);
  if (!s.allowed.empty()) return s.allowed[static_cast<size_t>(flag_choice(flag))];
  if (std::optional<std::string> o = current_override(flag)) return *o;
  return read_environment(flag).environment;
}

// Through the index, not the text: hot paths (every Linear) ask.
bool flag_on(Flag flag) { return std::strcmp(spec(flag).allowed.at(static_cast<size_t>(flag_choice(flag))), "1") == 0; }

void set_flag(Flag flag, std::optional<std::string> value) {
  const FlagSpec& s = spec(flag);
  State& st = states()[static_cast<size_t>(flag)];
  if (!s.allowed.empty()) {
    st.override_choice.store(value ? choice_index(s, *value, "set_flag") : -1, std::memory_order_relaxed);
    return;
  }
  std::lock_guard<std::mutex> lock(text_mutex());
  st.override_text = std::move(value);
}

ScopedFlag::ScopedFlag(Flag flag, const std::string& value) : flag_(flag), before_(current_override(flag)) {
  set_flag(flag, value);
}

ScopedFlag::~ScopedFlag() { set_flag(flag_, before_); }

std::string environment_reference() {
  std::string out = "| variable | default | values | meaning |\n| --- | --- | --- | --- |\n";
  for (const FlagSpec& s : kFlags) {
    std::string allowed;
    for (const char* a : s.allowed) allowed += fmt::format("{}`{}`", allowed.empty() ? "" : " \\| ", a);
    out += fmt::format("| `{}` | {} | {} | {} |\n", s.name, *s.fallback ? fmt::format("`{}`", s.fallback) : "(empty)",
                       allowed.empty() ? "a path" : allowed, markdown_cell(s.meaning));
  }
  out += "\nSet by dpt-run for the processes it starts (read by `rendezvous/env.h`):\n\n";
  out += "| variables | meaning |\n| --- | --- |\n";
  for (const LauncherVariable& v : kLauncherVariables) {
    out += fmt::format("| `{}` | {} |\n", v.name, markdown_cell(v.meaning));
  }
  return out;
}

}  // namespace dpt
