#!/usr/bin/env bash
# The README's first command: build dptrain (installing missing packages through scripts/setup.sh), then
# train the default config, an MLP on seeded synthetic spirals, on the GPU when there is one, else the
# CPU. Arguments go to dpt-train, e.g. --set training.steps=100. Output lands in ./runs/mlp_synthetic/.
#   DPT_BUILD_DIR   build directory (default build/)
#   DPT_SKIP_BUILD  1: use the existing build as is
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${DPT_BUILD_DIR:-$root/build}"
if [[ "${DPT_SKIP_BUILD:-0}" != 1 ]]; then
  DPT_BUILD_DIR="$build" "$root/scripts/build.sh"
fi
exec "$build/bin/dpt-train" --config "$root/configs/mlp_synthetic.yaml" "$@"
