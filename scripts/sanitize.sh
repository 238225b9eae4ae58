#!/usr/bin/env bash
# AddressSanitizer + UndefinedBehaviorSanitizer build of the CPU test suite: configures build-asan/ (or
# $DPT_ASAN_BUILD_DIR) with -DDPT_SANITIZE=ON -DDPT_CUDA=OFF, builds, and runs every test under CTest.
# Any sanitizer report fails its test (halt_on_error). Extra arguments go to ctest (e.g. -R reliability).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${DPT_ASAN_BUILD_DIR:-$root/build-asan}"
"$root/scripts/setup.sh"
# RelWithDebInfo: sanitizer reports with line numbers, and optimised enough that the suite stays fast.
# DPT_WERROR=OFF: GCC reports false -Wmaybe-uninitialized in libstdc++ (std::regex, std::function) under
# -fsanitize; the ordinary build keeps warnings as errors.
cmake -S "$root" -B "$build" -G Ninja -DDPT_SANITIZE=ON -DDPT_CUDA=OFF -DDPT_WERROR=OFF \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$build" -j "$(nproc)"
# Workers started by dpt-run inherit these. Leak checking stays on: the suite must not leak.
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:strict_string_checks=1:detect_stack_use_after_return=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
cd "$build"
ctest --output-on-failure -j "$(nproc)" --timeout 1200 "$@"
