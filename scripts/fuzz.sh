#!/usr/bin/env bash
# Builds the libFuzzer targets (fuzz/*_fuzz.cpp) with clang, ASan and UBSan and runs each for a bounded
# time, seeded from fuzz/corpus/<name>/. They live in the sanitizer build, build-asan/ (or
# $DPT_FUZZ_BUILD_DIR, else $DPT_ASAN_BUILD_DIR), configured by scripts/sanitize.sh.
#
#   scripts/fuzz.sh [SECONDS_PER_TARGET] [TARGET...]     default 60 s, every target
#
# New inputs the fuzzer finds go to a scratch corpus (not the repository); a crash, sanitizer report,
# leak or timeout stops that target with the reproducer written to <build>/findings/ and makes the exit
# status non-zero. The last line reads "fuzz: N targets, S s each, I inputs, F findings".
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${DPT_FUZZ_BUILD_DIR:-${DPT_ASAN_BUILD_DIR:-$root/build-asan}}"
seconds="${1:-60}"
shift || true

targets=("$@")
if ((${#targets[@]} == 0)); then
  for f in "$root"/fuzz/*_fuzz.cpp; do
    n="$(basename "$f" .cpp)"
    targets+=("${n%_fuzz}")
  done
fi
DPT_ASAN_BUILD_DIR="$build" "$root/scripts/sanitize.sh" --build "${targets[@]/#/dpt_fuzz_}"

mkdir -p "$build/findings"
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
# One target a core at a time: each fuzzer is one process on one core, so the targets' time is the same and
# the wall time shrinks.
fuzz_target() {  # fuzz_target NAME: writes its exit status to <build>/fuzz-NAME.status
  local t="$1" scratch="$build/corpus/$1" seeds=() dict=()
  mkdir -p "$scratch"
  [[ -d "$root/fuzz/corpus/$t" ]] && seeds=("$root/fuzz/corpus/$t")
  [[ -f "$root/fuzz/$t.dict" ]] && dict=("-dict=$root/fuzz/$t.dict")
  # -rss_limit_mb: a reader that allocates what a header claims instead of checking it first is a finding.
  local rc=0
  "$build/bin/dpt_fuzz_$t" "$scratch" "${seeds[@]}" "${dict[@]}" -max_total_time="$seconds" -timeout=10 \
    -rss_limit_mb=2048 -max_len=65536 -artifact_prefix="$build/findings/$t-" -print_final_stats=1 \
    2>"$build/fuzz-$t.log" || rc=$?
  echo "$rc" >"$build/fuzz-$t.status"
}
cores="$(nproc)"
for t in "${targets[@]}"; do
  while (($(jobs -rp | wc -l) >= cores)); do wait -n || true; done
  echo "== fuzzing $t for ${seconds}s"
  rm -f "$build/fuzz-$t.status"
  fuzz_target "$t" &
done
wait

findings=0
inputs=0
for t in "${targets[@]}"; do
  if [[ "$(cat "$build/fuzz-$t.status" 2>/dev/null)" != 0 ]]; then
    echo "fuzz.sh: $t FAILED; reproducer and log:" >&2
    ls "$build/findings/" | grep "^$t-" >&2 || true
    tail -40 "$build/fuzz-$t.log" >&2
    findings=$((findings + 1))
  else
    echo "== $t"
    grep -E "stat::number_of_executed_units|stat::new_units_added" "$build/fuzz-$t.log" | sed "s/^/   /"
  fi
  runs="$(grep -oE 'stat::number_of_executed_units: *[0-9]+' "$build/fuzz-$t.log" | grep -oE '[0-9]+$' || true)"
  inputs=$((inputs + ${runs:-0}))
done
echo "fuzz: ${#targets[@]} targets, ${seconds} s each, $inputs inputs, $findings findings (logs: $build/fuzz-*.log)"
((findings == 0))
