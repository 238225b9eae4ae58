#!/usr/bin/env bash
# Rewrites the generated tables of docs/config-reference.md (dpt-train --config-reference) and
# docs/environment.md (dpt-train --env-reference) from the code, keeping the introduction above each.
# A test fails while a file and the code disagree.
#   scripts/gen-config-reference.sh [build/bin/dpt-train]
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
train="${1:-${DPT_BUILD_DIR:-$root/build}/bin/dpt-train}"

# regenerate DOC FIRST_TABLE_LINE_PREFIX OPTION
regenerate() {
  local doc="$1" marker="$2" option="$3" tmp
  tmp="$(mktemp)"
  sed "/^$marker/,\$d" "$doc" >"$tmp"
  "$train" "$option" >>"$tmp"
  mv "$tmp" "$doc"
  echo "wrote $doc"
}
regenerate "$root/docs/config-reference.md" '| key |' --config-reference
regenerate "$root/docs/environment.md" '| variable |' --env-reference
