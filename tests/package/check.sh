#!/usr/bin/env bash
# The package as another project sees it: install this build into a scratch prefix, build the consumer
# (tests/package/consumer) against it with find_package(dptrain) and run it; then configure the consumer
# with add_subdirectory() of the source tree. The consumer finds the dependencies where this build found
# them (the build's CMAKE_PREFIX_PATH and friends are passed on).
#   tests/package/check.sh BUILD_DIR SCRATCH_DIR
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source_dir="$(cd "$here/../.." && pwd)"
build="$1"
scratch="$2"
rm -rf "$scratch"
mkdir -p "$scratch"
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)

cache_value() { sed -n "s/^$1:[A-Z]*=//p" "$build/CMakeCache.txt" | head -n 1; }
prefix="$scratch/prefix"
found_in="$(cache_value CMAKE_PREFIX_PATH)"
settings=(-DCMAKE_BUILD_TYPE=Release "-DCMAKE_PREFIX_PATH=$prefix${found_in:+;$found_in}")
for name in Eigen3_DIR CMAKE_POLICY_VERSION_MINIMUM CMAKE_EXE_LINKER_FLAGS CMAKE_CUDA_ARCHITECTURES; do
  value="$(cache_value "$name")"
  if [[ -n "$value" ]]; then settings+=("-D$name=$value"); fi
done

# step LOG COMMAND...: runs COMMAND into LOG; on failure shows the log's end and fails.
step() {
  local log="$scratch/$1"
  shift
  if ! "$@" >"$log" 2>&1; then
    echo "package: '$*' failed; the end of $log:"
    tail -n 30 "$log"
    exit 1
  fi
}
step install.log cmake --install "$build" --prefix "$prefix"
test -f "$prefix/include/dptrain/dptrain.h"
test -f "$prefix/share/dptrain/gpt2/encoder.json"
step configure.log cmake -S "$here/consumer" -B "$scratch/installed" "${generator[@]}" "${settings[@]}"
step build.log cmake --build "$scratch/installed"
"$scratch/installed/consumer"

step subdirectory.log cmake -S "$here/consumer" -B "$scratch/subdirectory" "${generator[@]}" "${settings[@]}" \
  -DDPTRAIN_SOURCE_DIR="$source_dir" -DDPT_CUDA=OFF
echo "package: installed and found; configured as a subdirectory"
