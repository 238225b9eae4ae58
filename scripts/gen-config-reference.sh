#!/usr/bin/env bash
# Rewrites the table of docs/config-reference.md from the code (dpt-train --config-reference), keeping
# the introduction above it. A test fails while the file and the code disagree.
#   scripts/gen-config-reference.sh [build/bin/dpt-train]
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
train="${1:-${DPT_BUILD_DIR:-$root/build}/bin/dpt-train}"
doc="$root/docs/config-reference.md"
tmp="$(mktemp)"
sed '/^| key |/,$d' "$doc" >"$tmp"
"$train" --config-reference >>"$tmp"
mv "$tmp" "$doc"
echo "wrote $doc"
