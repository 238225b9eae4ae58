#!/usr/bin/env bash
# The README's test command, and exactly what CI runs. Three parts, each run even when one before failed:
#   1. builds dptrain into build/ (or $DPT_BUILD_DIR) and runs every test; GPU tests skip without a GPU;
#   2. the AddressSanitizer + UndefinedBehaviorSanitizer build of the same CPU suite, with clang, in
#      build-asan/ (scripts/sanitize.sh);
#   3. every libFuzzer target of fuzz/ for $DPT_FUZZ_SECONDS (default 10) seconds, seeded from
#      fuzz/corpus/, built in the same build-asan/ (scripts/fuzz.sh).
# DPT_TEST_QUICK=1 runs only the first part (for a quick check while developing; CI never sets it).
# Extra arguments go to CMake for the first build. The last lines summarise the three parts; the exit
# status is non-zero when any of them failed.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${DPT_BUILD_DIR:-$root/build}"
asan_build="${DPT_ASAN_BUILD_DIR:-$root/build-asan}"
quick="${DPT_TEST_QUICK:-0}"
fuzz_seconds="${DPT_FUZZ_SECONDS:-10}"
export DPT_ASAN_BUILD_DIR="$asan_build"

# run_ctest_part LOG CMD...: runs a part whose output ends in CTest's, keeping it in LOG, and sets
# counts to "P passed, F failed, S skipped" (or why there are none). CTest's "tests passed" includes the
# GTEST_SKIP()ped tests, which it lists as "(Skipped)" under "The following tests did not run".
counts=""
run_ctest_part() {
  local log="$1"
  shift
  "$@" 2>&1 | tee "$log"
  local rc=${PIPESTATUS[0]}
  # "100% tests passed, 0 tests failed out of 18" (CMake 3) or "100% tests passed out of 18" (CMake 4).
  local line total failed=0 skipped=0
  line="$(grep -E 'tests passed.* out of [0-9]+' "$log" | tail -n 1)"
  if [[ -z "$line" ]]; then
    counts="did not run (exit $rc; log: $log)"
    return 1
  fi
  total="$(sed -E 's/.*out of ([0-9]+).*/\1/' <<<"$line")"
  if grep -qE '[0-9]+ tests failed' <<<"$line"; then
    failed="$(sed -E 's/.* ([0-9]+) tests failed.*/\1/' <<<"$line")"
  fi
  skipped="$(sed -n '/The following tests did not run:/,/^$/p' "$log" | grep -cE ' - .* \(Skipped\)$' || true)"
  counts="$((total - failed - skipped)) passed, $failed failed, $skipped skipped"
  return "$rc"
}

status=0
start=$SECONDS
echo "=== 1/3 test suite ($build)"
if "$root/scripts/build.sh" "$@"; then
  run_ctest_part "$build/test-suite.log" \
    bash -c 'cd "$1" && ctest --output-on-failure -j "$(nproc)" --timeout 900' _ "$build" || status=1
  suite="$counts"
else
  suite="build failed"
  status=1
fi
suite_s=$((SECONDS - start))

if [[ "$quick" == 1 ]]; then
  echo
  echo "=== dptrain test summary: ${suite_s} s ==="
  echo "sanitizer suite and fuzzing skipped (DPT_TEST_QUICK=1)"
  echo "tests: $suite"
  exit "$status"
fi

start=$SECONDS
echo "=== 2/3 AddressSanitizer + UndefinedBehaviorSanitizer suite ($asan_build)"
mkdir -p "$asan_build"
run_ctest_part "$asan_build/test-suite.log" "$root/scripts/sanitize.sh" || status=1
sanitized="$counts"
sanitize_s=$((SECONDS - start))

start=$SECONDS
echo "=== 3/3 fuzzing, ${fuzz_seconds} s per target ($asan_build)"
"$root/scripts/fuzz.sh" "$fuzz_seconds" 2>&1 | tee "$asan_build/fuzz.log"
fuzz_rc=${PIPESTATUS[0]}
fuzzed="$(grep -E '^fuzz: ' "$asan_build/fuzz.log" | tail -n 1 | sed -E 's/^fuzz: //; s/ \(logs: .*\)$//')"
if ((fuzz_rc != 0)); then
  status=1
  fuzzed="${fuzzed:-did not run (exit $fuzz_rc; log: $asan_build/fuzz.log)}"
fi
fuzz_s=$((SECONDS - start))

echo
echo "=== dptrain test summary: suite ${suite_s} s, sanitizers ${sanitize_s} s, fuzzing ${fuzz_s} s ==="
echo "tests: $suite"
echo "sanitizers: $sanitized"
echo "fuzz: $fuzzed"
exit "$status"
