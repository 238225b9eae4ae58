#!/usr/bin/env bash
# Draws a dpt-train metrics file (JSONL) as a PNG: training loss per logged step, and the validation
# loss where it was measured, against the step.
#   scripts/plot-metrics.sh runs/mlp_synthetic/metrics.jsonl loss.png
# Needs gnuplot (apt-get install gnuplot-nox); without it, says so and exits 0 having drawn nothing.
set -euo pipefail
if (($# != 2)); then
  echo "usage: $0 METRICS.jsonl OUT.png" >&2
  exit 2
fi
metrics="$1"
out="$2"
if [[ ! -r "$metrics" ]]; then
  echo "plot-metrics: cannot read '$metrics'" >&2
  exit 1
fi
if ! command -v gnuplot >/dev/null 2>&1; then
  echo "plot-metrics: gnuplot is not installed (apt-get install gnuplot-nox); skipping $out"
  exit 0
fi
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
# One "step value" row per record: "train" records give the loss, "eval" records the validation loss.
# null (a non-finite loss) is skipped.
extract() {  # extract TYPE FIELD
  sed -n "s/.*\"type\": \"$1\", \"step\": \([0-9]*\),.*\"$2\": \([^,}]*\).*/\1 \2/p" "$metrics" | grep -v ' null$' || true
}
extract train loss >"$tmp/train.dat"
extract eval val_loss >"$tmp/eval.dat"
if [[ ! -s "$tmp/train.dat" ]]; then
  echo "plot-metrics: '$metrics' has no training records" >&2
  exit 1
fi
plots="'$tmp/train.dat' using 1:2 with lines lw 2 title 'training loss'"
if [[ -s "$tmp/eval.dat" ]]; then
  plots+=", '$tmp/eval.dat' using 1:2 with linespoints pt 7 lw 2 title 'validation loss'"
fi
gnuplot <<GNUPLOT
if (strstrt(GPVAL_TERMINALS, "pngcairo") > 0) { set terminal pngcairo size 900,540 noenhanced } else { set terminal png size 900,540 noenhanced }
set output '$out'
set title '$(basename "$(dirname "$metrics")")'
set xlabel 'step'
set ylabel 'loss'
set grid
set key top right
plot $plots
GNUPLOT
echo "plot-metrics: wrote $out"
