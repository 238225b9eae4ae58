#!/usr/bin/env bash
# Builds dptrain and runs every test (GPU tests skip without a GPU). Prints CTest's summary last.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${DPT_BUILD_DIR:-$root/build}"
"$root/scripts/build.sh" "$@"
cd "$build"
ctest --output-on-failure -j "$(nproc)" --timeout 900
