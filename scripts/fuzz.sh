#!/usr/bin/env bash
# Builds the libFuzzer targets (fuzz/*_fuzz.cpp) with clang, ASan and UBSan into build-fuzz/ (or
# $DPT_FUZZ_BUILD_DIR) and runs each for a bounded time, seeded from fuzz/corpus/<name>/.
#
#   scripts/fuzz.sh [SECONDS_PER_TARGET] [TARGET...]     default 60 s, every target
#
# New inputs the fuzzer finds go to a scratch corpus (not the repository); a crash, sanitizer report,
# leak or timeout stops the run with the reproducer written to build-fuzz/findings/ and a non-zero exit.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${DPT_FUZZ_BUILD_DIR:-$root/build-fuzz}"
seconds="${1:-60}"
shift || true

DPT_SETUP_FUZZ=1 "$root/scripts/setup.sh"
cxx="${DPT_FUZZ_CXX:-}"
if [[ -z "$cxx" ]]; then
  for c in clang++ clang++-14 clang++-15 clang++-16 clang++-17 clang++-18; do
    if command -v "$c" >/dev/null; then cxx="$c"; break; fi
  done
fi
if [[ -z "$cxx" ]]; then
  echo "fuzz.sh: clang++ not found (scripts/setup.sh installs it)" >&2
  exit 1
fi
cc="${cxx/clang++/clang}"

targets=("$@")
if ((${#targets[@]} == 0)); then
  for f in "$root"/fuzz/*_fuzz.cpp; do
    n="$(basename "$f" .cpp)"
    targets+=("${n%_fuzz}")
  done
fi

CC="$cc" CXX="$cxx" cmake -S "$root" -B "$build" -G Ninja -DDPT_CUDA=OFF -DDPT_FUZZ=ON -DDPT_BUILD_TESTS=OFF \
  -DDPT_WERROR=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$build" -j "$(nproc)" --target "${targets[@]/#/dpt_fuzz_}"

mkdir -p "$build/findings"
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
status=0
for t in "${targets[@]}"; do
  scratch="$build/corpus/$t"
  mkdir -p "$scratch"
  seeds=()
  [[ -d "$root/fuzz/corpus/$t" ]] && seeds=("$root/fuzz/corpus/$t")
  dict=()
  [[ -f "$root/fuzz/$t.dict" ]] && dict=("-dict=$root/fuzz/$t.dict")
  echo "== fuzzing $t for ${seconds}s"
  # -rss_limit_mb: a reader that allocates what a header claims instead of checking it first is a finding.
  if ! "$build/bin/dpt_fuzz_$t" "$scratch" "${seeds[@]}" "${dict[@]}" -max_total_time="$seconds" -timeout=10 \
       -rss_limit_mb=2048 -max_len=65536 -artifact_prefix="$build/findings/$t-" -print_final_stats=1 \
       2>"$build/fuzz-$t.log"; then
    echo "fuzz.sh: $t FAILED; reproducer and log:" >&2
    ls "$build/findings/" | grep "^$t-" >&2 || true
    tail -40 "$build/fuzz-$t.log" >&2
    status=1
  else
    grep -E "stat::number_of_executed_units|stat::new_units_added" "$build/fuzz-$t.log" | sed "s/^/   /"
  fi
done
exit $status
