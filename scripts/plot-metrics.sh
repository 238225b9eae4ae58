#!/usr/bin/env bash
# Draws dpt-train metrics (JSONL) as one PNG: training loss per logged step with the validation loss
# where it was measured, and below it the throughput (units/s, all ranks) when the runs logged it. Several
# runs share the plot, one colour each, named in the legend by their run directory.
#   scripts/plot-metrics.sh runs/char_gpt/metrics.jsonl loss.png
#   scripts/plot-metrics.sh runs/lr_3e-4 runs/lr_1e-3 compare.png    (run directories or metrics files)
# Needs gnuplot (apt-get install gnuplot-nox); without it, says so and exits 0 having drawn nothing.
set -euo pipefail
if (($# < 2)); then
  echo "usage: $0 RUN_OR_METRICS.jsonl... OUT.png" >&2
  exit 2
fi
out="${*: -1}"
runs=("${@:1:$#-1}")
metrics=()
for run in "${runs[@]}"; do
  file="$run"
  [[ -d "$run" ]] && file="$run/metrics.jsonl"
  if [[ ! -r "$file" || -d "$file" ]]; then
    echo "plot-metrics: cannot read '$file'" >&2
    exit 1
  fi
  metrics+=("$file")
done
if ! command -v gnuplot >/dev/null 2>&1; then
  echo "plot-metrics: gnuplot is not installed (apt-get install gnuplot-nox); skipping $out"
  exit 0
fi
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
# One "step value" row per record of TYPE with FIELD; null (a non-finite value) is skipped.
extract() {  # extract FILE TYPE FIELD
  sed -n "s/.*\"type\": \"$2\", \"step\": \([0-9]*\),.*\"$3\": \([^,}]*\).*/\1 \2/p" "$1" | grep -v ' null$' || true
}
# A run's name in the legend: its directory, or the path given when two runs share a directory name.
label() {  # label INDEX
  local name
  name="$(basename "$(dirname "$(realpath "${metrics[$1]}")")")"
  local i
  for i in "${!metrics[@]}"; do
    if ((i != $1)) && [[ "$(basename "$(dirname "$(realpath "${metrics[$i]}")")")" == "$name" ]]; then
      name="${runs[$1]}"
    fi
  done
  printf '%s' "${name//\'/\'\'}"  # gnuplot doubles a quote inside a single-quoted string
}
loss_plots=()
speed_plots=()
unit=""
for i in "${!metrics[@]}"; do
  extract "${metrics[$i]}" train loss >"$tmp/train$i.dat"
  extract "${metrics[$i]}" eval val_loss >"$tmp/eval$i.dat"
  extract "${metrics[$i]}" train throughput >"$tmp/speed$i.dat"
  if [[ ! -s "$tmp/train$i.dat" ]]; then
    echo "plot-metrics: '${metrics[$i]}' has no training records" >&2
    exit 1
  fi
  name="$(label "$i")"
  colour=$((i + 1))
  loss_plots+=("'$tmp/train$i.dat' using 1:2 with lines lw 2 lc $colour title '$name'")
  if [[ -s "$tmp/eval$i.dat" ]]; then
    loss_plots+=("'$tmp/eval$i.dat' using 1:2 with linespoints pt 7 dt 2 lw 2 lc $colour title '$name (validation)'")
  fi
  if [[ -s "$tmp/speed$i.dat" ]]; then
    speed_plots+=("'$tmp/speed$i.dat' using 1:2 with lines lw 2 lc $colour title '$name'")
    [[ -z "$unit" ]] && unit="$(sed -n 's/.*"unit": "\([^"]*\)".*/\1/p' "${metrics[$i]}" | head -n 1)"
  fi
done
join() { local IFS=','; printf '%s' "$*"; }
title="$(basename "$(dirname "$(realpath "${metrics[0]}")")")"
((${#metrics[@]} > 1)) && title="${#metrics[@]} runs"
if ((${#speed_plots[@]} > 0)); then
  size="900,900"
  layout="set multiplot layout 2,1"
  speed="set title 'throughput'; set ylabel '${unit:-units/s}'; set yrange [0:*]; plot $(join "${speed_plots[@]}")"
  done_cmd="unset multiplot"
else
  size="900,540"
  layout=""
  speed=""
  done_cmd=""
fi
gnuplot <<GNUPLOT
if (strstrt(GPVAL_TERMINALS, "pngcairo") > 0) { set terminal pngcairo size $size noenhanced } else { set terminal png size $size noenhanced }
set output '$out'
set grid
set key top right
set xlabel 'step'
$layout
set title '${title//\'/\'\'}'
set ylabel 'loss'
plot $(join "${loss_plots[@]}")
$speed
$done_cmd
GNUPLOT
echo "plot-metrics: wrote $out"
