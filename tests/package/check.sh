#!/usr/bin/env bash
# The package as another project sees it: install this build into a scratch prefix, build the consumer
# (tests/package/consumer) against it with find_package(dptrain) and run it; then configure the consumer
# with add_subdirectory() of the source tree.
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

cmake --install "$build" --prefix "$scratch/prefix" >"$scratch/install.log"
test -f "$scratch/prefix/include/dptrain/dptrain.h"
test -f "$scratch/prefix/share/dptrain/gpt2/encoder.json"
cmake -S "$here/consumer" -B "$scratch/installed" "${generator[@]}" -DCMAKE_PREFIX_PATH="$scratch/prefix" \
  -DCMAKE_BUILD_TYPE=Release >"$scratch/configure.log"
cmake --build "$scratch/installed" >"$scratch/build.log"
"$scratch/installed/consumer"

cmake -S "$here/consumer" -B "$scratch/subdirectory" "${generator[@]}" -DDPTRAIN_SOURCE_DIR="$source_dir" \
  -DDPT_CUDA=OFF >"$scratch/subdirectory.log"
echo "package: installed and found; configured as a subdirectory"
