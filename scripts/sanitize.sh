#!/usr/bin/env bash
# AddressSanitizer + UndefinedBehaviorSanitizer build of the CPU test suite, with clang, into build-asan/
# (or $DPT_ASAN_BUILD_DIR): configures with -DDPT_SANITIZE=ON -DDPT_FUZZ=ON -DDPT_CUDA=OFF, builds, and
# runs every test under CTest. Any sanitizer report fails its test (halt_on_error).
#
#   scripts/sanitize.sh [CTEST_ARGS...]     build everything, run the suite (e.g. -R reliability)
#   scripts/sanitize.sh --build TARGET...   configure and build only these targets (scripts/fuzz.sh)
#
# The same build holds the libFuzzer targets (DPT_FUZZ, clang only), so test.sh compiles the project
# once for both; the fuzzer's coverage instrumentation rides along in the tests.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${DPT_ASAN_BUILD_DIR:-$root/build-asan}"

DPT_SETUP_FUZZ=1 "$root/scripts/setup.sh"
cxx="${DPT_SANITIZE_CXX:-}"
if [[ -z "$cxx" ]]; then
  for c in clang++ clang++-19 clang++-18 clang++-17 clang++-16 clang++-15 clang++-14; do
    if command -v "$c" >/dev/null; then cxx="$(command -v "$c")"; break; fi
  done
fi
if [[ -z "$cxx" ]]; then
  echo "sanitize.sh: clang++ not found (scripts/setup.sh installs it)" >&2
  exit 1
fi
cc="${cxx/clang++/clang}"
# A directory configured with another compiler (an older GCC sanitizer build) starts over: CMake keeps
# the first compiler of a cache.
if [[ -f "$build/CMakeCache.txt" ]] && ! grep -qxF "CMAKE_CXX_COMPILER:FILEPATH=$cxx" "$build/CMakeCache.txt"; then
  rm -rf "$build/CMakeCache.txt" "$build/CMakeFiles"
fi
# -O1 -gline-tables-only: the optimisation ASan's documentation suggests, reports with file:line, and
# quicker to compile than -O2 -g. DPT_WERROR=OFF: warnings are the ordinary (GCC) build's to stop.
CC="$cc" CXX="$cxx" cmake -S "$root" -B "$build" -G Ninja -DDPT_SANITIZE=ON -DDPT_FUZZ=ON -DDPT_CUDA=OFF \
  -DDPT_WERROR=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -gline-tables-only -DNDEBUG" \
  >/dev/null

if [[ "${1:-}" == --build ]]; then
  shift
  cmake --build "$build" -j "$(nproc)" --target "$@"
  exit 0
fi
cmake --build "$build" -j "$(nproc)"
# The whole CPU suite runs, none skipped: under ASan it takes about 2 minutes on 2 cores, the slowest test
# (the trainer restart after a SIGKILL, ~30 s) covers paths no other test does.
# Workers started by dpt-run inherit these. Leak checking stays on: the suite must not leak.
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:strict_string_checks=1:detect_stack_use_after_return=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
cd "$build"
ctest --output-on-failure -j "$(nproc)" --timeout 1200 "$@"
