#!/usr/bin/env bash
# Builds dptrain with CUDA on a GPU machine and runs the test suite; prints a short summary last.
#
#   scripts/gpu-test.sh                # every test
#   scripts/gpu-test.sh -R 'Cuda'      # extra arguments go to ctest
#   DPT_GPU_TEST_TARGETS="dpt_core_tests" scripts/gpu-test.sh -R Cuda   # build only these targets
#   DPT_GPU_TEST_CONVERGENCE=0 scripts/gpu-test.sh   # without the convergence check against PyTorch
#
# After the tests, scripts/gpu-convergence.sh trains every benchmark workload in dptrain and in PyTorch
# from the same start and fails the run when dptrain's loss curve leaves PyTorch's by more than twice
# PyTorch's distance from itself (about 13 minutes on one GPU; its table is printed in the summary). It
# runs unless DPT_GPU_TEST_CONVERGENCE=0, or DPT_GPU_TEST_TARGETS builds a subset (then
# DPT_GPU_TEST_CONVERGENCE=1 runs it all the same). On four GPUs, DPT_CONV_JOBS=2 runs two of its
# combinations at once, on GPUs 0-1 and 2-3.
#
# A build error does not stop the run: everything that still builds is built and tested, and the
# summary says the build was incomplete.
# Run from anywhere in the checkout. The C++ dependencies the GPU machines lack are Debian packages
# unpacked into .deps/: libeigen3-dev libspdlog-dev libspdlog1.10 libfmt-dev libfmt9 libyaml-cpp-dev
# libyaml-cpp0.7 libgtest-dev libgloo-dev libgloo0 libhiredis0.14 libibverbs1 libnl-3-200 libnl-route-3-200
# libcli11-dev nlohmann-json3-dev libicu-dev libicu72 (static archives other than GoogleTest's may be left
# out: they are not linked). Builds into
# build-gpu/ (or $DPT_BUILD_DIR) with every core; logs go to $OUT (if set) or the build directory.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
build="${DPT_BUILD_DIR:-$root/build-gpu}"
logs="${OUT:-$build}"
mkdir -p "$build" "$logs"
# .deps on the library path, NVLink multicast off, gpu_configure (scripts/gpu-configure.sh).
source "$root/scripts/gpu-configure.sh"
jobs="$(nproc)"

summary() {  # summary <status line> : device, counts and failures, printed last
  local device
  device="$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | sort | uniq -c | sed 's/^ *//' | paste -sd ', ' -)"
  echo
  echo "=== dptrain GPU test summary ==="
  echo "device:  ${device:-no GPU visible to nvidia-smi}"
  # A copied working tree may carry changes its .git does not know: say how many files differ.
  local changed
  changed="$(git -C "$root" status --porcelain --untracked-files=no 2>/dev/null | wc -l)"
  echo "commit:  $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)$([[ "$changed" != 0 ]] && echo " + $changed changed files")"
  echo "$1"
}

echo "gpu-test: configuring into $build"
if ! gpu_configure "$root" "$build" "$logs/configure.log"; then
  tail -n 30 "$logs/configure.log"
  summary "result:  CONFIGURE FAILED (log: $logs/configure.log)"
  exit 1
fi

read -r -a targets <<<"${DPT_GPU_TEST_TARGETS:-}"
target_args=()
if ((${#targets[@]})); then target_args=(--target "${targets[@]}"); fi
echo "gpu-test: building ${targets[*]:-everything} with $jobs jobs (log: $logs/build.log)"
build_note=""
if ! cmake --build "$build" -j "$jobs" "${target_args[@]}" -- "${keep_going[@]}" >"$logs/build.log" 2>&1; then
  grep -E "error|FAILED" "$logs/build.log" | head -n 40
  build_note="build:   INCOMPLETE, some targets failed (log: $logs/build.log); testing what built"
  if ! compgen -G "$build/bin/*_tests" >/dev/null; then
    summary "result:  BUILD FAILED, no test executable was built (log: $logs/build.log)"
    exit 1
  fi
fi

echo "gpu-test: running ctest (log: $logs/ctest.log)"
# With the durations of an earlier run at hand, ctest starts the longest tests first: every long GPU test
# at once, dozens of CUDA contexts and cuBLAS workspaces on GPU 0, which exhausts its memory. Without them
# it runs the tests in the order they are defined, GPU tests spread among CPU ones: every run alike.
rm -f "$build/Testing/Temporary/CTestCostData.txt"
(cd "$build" && ctest -V -j "$jobs" --timeout 900 "$@") >"$logs/ctest.log" 2>&1
ctest_status=$?

# ctest counts GTEST_SKIP()ped tests as passed; count them from GoogleTest's own lines.
# "100% tests passed, 0 tests failed out of 18" (CMake 3) or "100% tests passed out of 18" (CMake 4).
total_line="$(grep -E 'tests passed.* out of [0-9]+' "$logs/ctest.log" | tail -n 1)"
total="$(sed -E 's/.*out of ([0-9]+).*/\1/' <<<"$total_line")"
failed=0
if grep -qE '[0-9]+ tests failed' <<<"$total_line"; then
  failed="$(sed -E 's/.* ([0-9]+) tests failed.*/\1/' <<<"$total_line")"
fi
skipped="$(grep -oE '\[  SKIPPED \] [A-Za-z0-9_/.]+ \(' "$logs/ctest.log" | sort -u | wc -l)"
failures="$(sed -n '/The following tests FAILED:/,$p' "$logs/ctest.log" | grep -E '^\s+[0-9]+ - ' | sed -E 's/^\s+[0-9]+ - //')"
if [[ -z "$total_line" ]]; then
  tail -n 30 "$logs/ctest.log"
  summary "result:  CTEST DID NOT FINISH (status $ctest_status, log: $logs/ctest.log)"
  exit 1
fi
# dptrain's loss curves against PyTorch's (scripts/gpu-convergence.sh): a missed bar fails the run.
convergence_mode="${DPT_GPU_TEST_CONVERGENCE:-}"
if [[ -z "$convergence_mode" ]]; then
  convergence_mode=1
  if ((${#targets[@]})); then convergence_mode=0; fi
fi
if [[ "$convergence_mode" == 0 ]]; then
  why="DPT_GPU_TEST_CONVERGENCE=0"
  [[ -z "${DPT_GPU_TEST_CONVERGENCE:-}" ]] && why="DPT_GPU_TEST_TARGETS builds a subset; DPT_GPU_TEST_CONVERGENCE=1 runs it"
  convergence="convergence: skipped ($why)"
else
  echo "gpu-test: dptrain against PyTorch, scripts/gpu-convergence.sh (log: $logs/convergence.log)"
  OUT="$logs" DPT_BUILD_DIR="$build" "$root/scripts/gpu-convergence.sh" >"$logs/convergence.log" 2>&1
  convergence_status=$?
  table="$(sed -n '/^=== dptrain against PyTorch/,$p' "$logs/convergence.log")"
  if ((convergence_status == 0)); then
    convergence="convergence: PASS (log: $logs/convergence.log)"
  else
    convergence="convergence: FAIL, status $convergence_status (log: $logs/convergence.log)"
    [[ -n "$table" ]] || table="$(tail -n 15 "$logs/convergence.log")"
    ((ctest_status == 0)) && ctest_status=1
  fi
  [[ -n "$table" ]] && convergence+=$'\n'"$(sed 's/^/  /' <<<"$table")"
fi

passed=$((total - failed - skipped))
result="tests:   $passed passed, $failed failed, $skipped skipped (of $total; log: $logs/ctest.log)"
if [[ -n "$failures" ]]; then
  result+=$'\n'"failed:"$'\n'"$(sed 's/^/  /' <<<"$failures")"
fi
if [[ -n "$build_note" ]]; then
  result="$build_note"$'\n'"$result"
  ((ctest_status == 0)) && ctest_status=1
fi
result+=$'\n'"$convergence"
summary "$result"
exit "$ctest_status"
