#!/usr/bin/env bash
# compute-sanitizer memcheck over the GPU tests, on a GPU machine, after scripts/gpu-test.sh has built
# build-gpu/ (or $DPT_BUILD_DIR). Each test executable runs once under memcheck with a GoogleTest filter
# that keeps its CUDA tests; a summary per executable (tests run, failed, memcheck errors) is printed last.
#
#   scripts/gpu-sanitize.sh                          # every build-gpu/bin/*_tests
#   scripts/gpu-sanitize.sh dpt_core_tests           # only these executables
#   DPT_GPU_SANITIZE_FILTER='CudaFlash*' scripts/gpu-sanitize.sh dpt_core_tests
#   DPT_GPU_SANITIZE_LEAKS=1 scripts/gpu-sanitize.sh # also memcheck's leak check (see below)
#   DPT_GPU_SANITIZE_TIMEOUT=500 scripts/gpu-sanitize.sh dpt_layers_tests   # seconds per executable (1800)
#
# Logs go to $OUT (if set) or the build directory: sanitize-<executable>.log. Exits non-zero when any
# executable has a memcheck error, a failed test, or did not finish.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${DPT_BUILD_DIR:-$root/build-gpu}"
logs="${OUT:-$build}"
deps="$root/.deps"
mkdir -p "$logs"

# As in gpu-test.sh: never let NCCL or anything else set up NVLink multicast on these machines, and find
# the C++ dependencies unpacked into .deps/.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
dep_libs="$deps/usr/lib/x86_64-linux-gnu:$deps/usr/lib:$deps/lib/x86_64-linux-gnu"
export LD_LIBRARY_PATH="$dep_libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# Every free goes back to the driver's pool, so memcheck sees a use after free as one (a block held in
# the allocator's host-side cache would still count as allocated).
export DPT_NO_CUDA_MEMORY_CACHING=1

# The tests that touch the GPU: suites and names with Cuda or Gpu (CudaParity.*, LoaderOnGpu.*,
# DdpParityCuda.*TwoGpus, ...) and the NCCL collectives. CPU tests that match (e.g. the error for
# training.device: cuda in a CPU build) are cheap and harmless.
filter="${DPT_GPU_SANITIZE_FILTER:-*Cuda*:*Gpu*:*Nccl*}"
# NcclFailures.* kill or stall a peer and assert the survivor fails within a wall-clock bound; under
# memcheck's slowdown that bound measures the tool, and their memory use is NcclCollectives' already.
exclude="${DPT_GPU_SANITIZE_EXCLUDE:-NcclFailures.*}"

sanitizer="$(command -v compute-sanitizer || true)"
for dir in "${CUDA_HOME:-}" "${CUDA_PATH:-}" /usr/local/cuda; do
  if [[ -z "$sanitizer" && -n "$dir" && -x "$dir/bin/compute-sanitizer" ]]; then
    sanitizer="$dir/bin/compute-sanitizer"
  fi
done
if [[ -z "$sanitizer" ]]; then
  echo "gpu-sanitize: compute-sanitizer not found (PATH, \$CUDA_HOME/bin, /usr/local/cuda/bin)" >&2
  exit 2
fi

# GPUs this process may use: CUDA_VISIBLE_DEVICES when set, else every GPU nvidia-smi lists.
if [[ -n "${CUDA_VISIBLE_DEVICES:-}" ]]; then
  IFS=, read -r -a visible <<<"$CUDA_VISIBLE_DEVICES"
  gpus=${#visible[@]}
else
  gpus="$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)"
fi
if ((gpus == 0)); then
  echo "gpu-sanitize: no GPU visible (nvidia-smi -L lists none)" >&2
  exit 2
fi
# The multi-GPU tests start NCCL workers through dpt-run; with one GPU they would only skip, each after
# starting the executable under memcheck, so they are filtered out instead.
if ((gpus < 2)); then
  exclude+=":*TwoGpus*:NcclCollectives.*"
fi

binaries=()
if (($#)); then
  for name in "$@"; do binaries+=("$build/bin/$(basename "$name")"); done
else
  for path in "$build"/bin/*_tests; do [[ -x "$path" ]] && binaries+=("$path"); done
fi
if ((${#binaries[@]} == 0)); then
  echo "gpu-sanitize: no test executable in $build/bin (run scripts/gpu-test.sh first)" >&2
  exit 2
fi

# memcheck options:
# One memcheck instance per process. The DDP and NCCL tests start their workers through dpt-run; the
# tests put $DPT_TEST_WORKER_PREFIX (tests/distributed/worker_command.h) in front of each worker, so
# each worker runs under its own instance, which writes its report to $logs/sanitize-worker-<pid>.log
# (summed below) and makes the worker exit non-zero on an error, failing the test. The test executable
# itself is checked with --target-processes application-only: one instance following the whole tree
# (test, dpt-run, both NCCL workers) never finished the first 2-GPU DDP test on 2 x H200, while one
# instance per worker checks that pair of workers in about 30 s.
# --report-api-errors no: an error status from a CUDA call is the project's to check (DPT_CUDA_CHECK
#   throws and the test fails), and CudaChecks provokes one on purpose; memcheck's job here is device
#   memory accesses.
# Leak check is off unless DPT_GPU_SANITIZE_LEAKS=1. memcheck tracks cudaMallocAsync/cudaFreeAsync on
# the stream-ordered pool like any allocation, so tensor memory is checked fine; but the per-stream
# GEMM workspaces (core/cuda/handles.cpp) and the cuBLAS/cuDNN handles are held for the life of the
# process by design and no test destroys its context, so a leak report lists those and would fail every
# executable. Tensor leaks are asserted directly by CudaAllocator.LiveBytesGoBackDownWhenTensorsDie.
# NCCL's own kernels are not instrumented (--kernel-name-exclude kns=nccl) unless
# DPT_GPU_SANITIZE_NCCL=1: they are not our code, and a collective kernel spins on flags its peer
# process writes, so instrumenting it only slows both processes.
nccl=(--kernel-name-exclude kns=nccl)
if [[ "${DPT_GPU_SANITIZE_NCCL:-0}" == 1 ]]; then nccl=(); fi
leak=()  # memcheck default: no leak check
if [[ "${DPT_GPU_SANITIZE_LEAKS:-0}" == 1 ]]; then leak=(--leak-check full); fi
timeout_s="${DPT_GPU_SANITIZE_TIMEOUT:-1800}"
memcheck=("$sanitizer" --tool memcheck --error-exitcode 1 --report-api-errors no "${nccl[@]}" "${leak[@]}"
  --print-limit 200)
rm -f "$logs"/sanitize-worker-*.log
export DPT_TEST_WORKER_PREFIX="${memcheck[*]} --log-file $logs/sanitize-worker-%p.log"

echo "gpu-sanitize: $sanitizer, $gpus GPU(s), filter '$filter' minus '$exclude', logs in $logs"
rows=()
status=0
for bin in "${binaries[@]}"; do
  name="$(basename "$bin")"
  log="$logs/sanitize-$name.log"
  if [[ ! -x "$bin" ]]; then
    rows+=("$(printf '%-26s %s' "$name" "MISSING ($bin)")")
    status=1
    continue
  fi
  # An executable with no matching test is not started under memcheck at all.
  matching="$("$bin" --gtest_list_tests --gtest_filter="$filter-$exclude" 2>/dev/null | grep -c '^  ' || true)"
  if ((matching == 0)); then
    rows+=("$(printf '%-26s %4s run' "$name" 0)")
    continue
  fi
  # Same working directory as under ctest (gtest_discover_tests runs in <build>/tests).
  echo "gpu-sanitize: $name (log: $log)"
  (cd "$build/tests" && timeout --kill-after=30 "$timeout_s" "${memcheck[@]}" --target-processes application-only \
     "$bin" --gtest_filter="$filter-$exclude" --gtest_color=no) >"$log" 2>&1
  rc=$?
  # GoogleTest's own counts: "[==========] 12 tests from 3 test suites ran.", "[  PASSED  ] 10 tests.",
  # "[  SKIPPED ] 2 tests, listed below:", "[  FAILED  ] 1 test, listed below:".
  ran="$(grep -oE '^\[==========\] [0-9]+ tests? from .* ran' "$log" | tail -n 1 | grep -oE '[0-9]+' | head -n 1)"
  failed="$(grep -oE '^\[  FAILED  \] [0-9]+ tests?, listed below' "$log" | tail -n 1 | grep -oE '[0-9]+' | head -n 1)"
  skipped="$(grep -oE '^\[  SKIPPED \] [0-9]+ tests?, listed below' "$log" | tail -n 1 | grep -oE '[0-9]+' | head -n 1)"
  # One "========= ERROR SUMMARY: N errors" per checked process: the executable's in its log, each
  # worker's in its own file (then moved aside, so the next executable counts only its own workers).
  workers=("$logs"/sanitize-worker-*.log)
  [[ -e "${workers[0]}" ]] || workers=()
  errors="$(cat "$log" "${workers[@]}" | grep -oE '^========= ERROR SUMMARY: [0-9]+ error' | grep -oE '[0-9]+' |
    awk '{s += $1} END {print s + 0}')"
  checked="$(cat "${workers[@]}" /dev/null | grep -cE '^========= ERROR SUMMARY' || true)"
  if ((${#workers[@]})); then cat "${workers[@]}" >"$logs/sanitize-$name-workers.log" && rm -f "${workers[@]}"; fi
  note=""
  if [[ -z "$ran" ]]; then
    if ((rc == 124 || rc == 137)); then note="TIMED OUT after ${timeout_s}s"; else note="DID NOT FINISH (exit $rc)"; fi
    status=1
  elif ((rc != 0 || errors > 0)) || [[ -n "$failed" ]]; then
    note="FAILED (exit $rc)"
    status=1
  fi
  rows+=("$(printf '%-26s %4s run %4s failed %4s skipped %5s memcheck errors %4s workers checked  %s' "$name" \
    "${ran:-?}" "${failed:-0}" "${skipped:-0}" "$errors" "$checked" "$note")")
done

echo
echo "=== dptrain compute-sanitizer memcheck summary ==="
echo "device:  $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | sort | uniq -c | sed 's/^ *//' | paste -sd ', ' -)"
echo "commit:  $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)"
echo "leaks:   $([[ "${DPT_GPU_SANITIZE_LEAKS:-0}" == 1 ]] && echo checked || echo 'not checked (DPT_GPU_SANITIZE_LEAKS=1)')"
printf '%s\n' "${rows[@]}"
if ((status == 0)); then echo "result:  PASSED"; else echo "result:  FAILED (logs: $logs/sanitize-*.log)"; fi
exit "$status"
