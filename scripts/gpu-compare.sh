#!/usr/bin/env bash
# Before and after in one run: `dpt-bench train` built from another commit (BASE) beside this checkout's
# build, for the benchmark workloads on 1 and 2 GPUs, eagerly and replayed from a CUDA graph. The two builds
# run alternately (BASE, this, BASE, this, ...) so that the machine's drift falls on both. Prints the table
# last: each run's step (ms), and this checkout's median over BASE's.
#
#   scripts/gpu-compare.sh 692154c                    # tiny_gpt mlp_92m gpt2_124m, 1 and 2 GPUs
#   DPT_CMP_WORKLOADS=mlp_92m DPT_CMP_GPUS="2 4" DPT_CMP_ARGS="--gathered-grads" scripts/gpu-compare.sh HEAD~3
#
# DPT_CMP_WORKLOADS  tiny_gpt mlp_92m gpt2_124m    DPT_CMP_GPUS   1 2
# DPT_CMP_MODES      eager graph                   DPT_CMP_REPS   2 (runs of each side)
# DPT_CMP_STEPS      timed steps a run (60; GPT-2 20)
# DPT_CMP_ARGS       more `dpt-bench train` flags, the same for both sides
# BASE is built from `git archive BASE` into build-compare/<commit>/ (dpt-bench and dpt-run only, with
# scripts/gpu-configure.sh); this side is build-gpu/ (or $DPT_BUILD_DIR), whose dpt-bench and dpt-run are
# built if missing. Logs go to $OUT (if set) or build-compare/.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
base_rev="${1:-}"
[[ -n "$base_rev" && "$base_rev" != -* ]] || {
  echo "usage: scripts/gpu-compare.sh BASE   (a commit; settings: DPT_CMP_* variables, see the header)" >&2
  exit 2
}
base_commit="$(git -C "$root" rev-parse --short "$base_rev^{commit}" 2>/dev/null)" || {
  echo "gpu-compare: '$base_rev' is not a commit of this checkout" >&2
  exit 2
}
compare="$root/build-compare"
logs="${OUT:-$compare}"
this_build="${DPT_BUILD_DIR:-$root/build-gpu}"
base_build="$compare/$base_commit"
read -r -a workloads <<<"${DPT_CMP_WORKLOADS:-tiny_gpt mlp_92m gpt2_124m}"
read -r -a gpu_counts <<<"${DPT_CMP_GPUS:-1 2}"
read -r -a modes <<<"${DPT_CMP_MODES:-eager graph}"
reps="${DPT_CMP_REPS:-2}"
read -r -a extra <<<"${DPT_CMP_ARGS:-}"
[[ "$reps" =~ ^[1-9][0-9]*$ ]] || { echo "gpu-compare: DPT_CMP_REPS must be a positive whole number" >&2; exit 2; }
for m in "${modes[@]}"; do
  [[ "$m" =~ ^(eager|graph)$ ]] || { echo "gpu-compare: unknown mode '$m' in DPT_CMP_MODES (eager graph)" >&2; exit 2; }
done
mkdir -p "$compare" "$logs"
# .deps on the library path, NVLink multicast off, gpu_configure; then the NCCL PyTorch brings (gpu-env.sh).
source "$root/scripts/gpu-configure.sh"
source "$root/scripts/gpu-env.sh"

build() {  # build SOURCE BUILD NAME: dpt-bench and dpt-run of SOURCE into BUILD
  local source="$1" build="$2" name="$3"
  echo "gpu-compare: building $name into $build"
  if ! gpu_configure "$source" "$build" "$logs/configure-$name.log" ||
    ! cmake --build "$build" -j "$(nproc)" --target dpt-bench dpt-run >"$logs/build-$name.log" 2>&1; then
    grep -E "error|FAILED" "$logs/build-$name.log" "$logs/configure-$name.log" 2>/dev/null | head -n 20
    echo "gpu-compare: $name did not build (logs: $logs/configure-$name.log, $logs/build-$name.log)" >&2
    exit 1
  fi
}
if [[ ! -x "$base_build/bin/dpt-bench" ]]; then
  rm -rf "$base_build/src"
  mkdir -p "$base_build/src"
  git -C "$root" archive "$base_commit" | tar -x -C "$base_build/src" || exit 1
  build "$base_build/src" "$base_build" "$base_commit"
fi
[[ -x "$this_build/bin/dpt-bench" && -x "$this_build/bin/dpt-run" ]] || build "$root" "$this_build" this

step_ms() {  # step_ms BIN WORKLOAD GPUS MODE LOG: one run's median step (ms), or NA
  local bin="$1" w="$2" n="$3" mode="$4" log="$5" steps="${DPT_CMP_STEPS:-60}"
  [[ -n "${DPT_CMP_STEPS:-}" || "$w" != gpt2_124m ]] || steps=20
  local cmd=("$bin/dpt-bench" train --workload "$w" --steps "$steps" --warmup 5 "${extra[@]}")
  [[ "$mode" == eager ]] || cmd+=(--cuda-graph)
  ((n == 1)) || cmd=("$bin/dpt-run" --standalone --nproc-per-node "$n" -- "${cmd[@]}")
  timeout 600 "${cmd[@]}" >"$log" 2>&1
  python3 "$root/bench/logged.py" bench "$log"
}

results="$logs/compare.tsv"
: >"$results"
for w in "${workloads[@]}"; do
  for n in "${gpu_counts[@]}"; do
    for mode in "${modes[@]}"; do
      base_ms=() this_ms=()
      for ((r = 1; r <= reps; r++)); do
        base_ms+=("$(step_ms "$base_build/bin" "$w" "$n" "$mode" "$logs/${w}_${n}_${mode}_base$r.log")")
        this_ms+=("$(step_ms "$this_build/bin" "$w" "$n" "$mode" "$logs/${w}_${n}_${mode}_this$r.log")")
      done
      (IFS=,; printf '%s\t%s\t%s\t%s\t%s\n' "$w" "$n" "$mode" "${base_ms[*]}" "${this_ms[*]}") | tee -a "$results"
    done
  done
done

# A working tree with changes its .git does not hold is named "<HEAD>+changes", not after HEAD alone.
this_commit="$(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)"
[[ -z "$(git -C "$root" status --porcelain --untracked-files=no 2>/dev/null)" ]] || this_commit+="+changes"
python3 - "$results" "$base_commit" "$this_commit" "$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1)" \
  "${extra[*]}" <<'PY'
import statistics, sys
path, base, this, device, extra = sys.argv[1:6]
print(f"\n=== dpt-bench train, {base} against {this}, alternating runs, one machine ({device}) ===")
if extra:
    print(f"flags for both: {extra}")
print(f"| workload | GPUs | mode | {base} ms | {this} ms | {this} / {base} |")
print("| --- | --- | --- | --- | --- | --- |")
for line in open(path):
    w, n, mode, a, b = line.rstrip("\n").split("\t")
    def median(cells):
        values = [float(v) for v in cells.split(",") if v != "NA"]
        return statistics.median(values) if values else None
    ma, mb = median(a), median(b)
    ratio = f"{mb / ma:.3f}" if ma and mb else "NA"
    print(f"| {w} | {n} | {mode} | {a.replace(',', ' / ')} | {b.replace(',', ' / ')} | {ratio} |")
PY
