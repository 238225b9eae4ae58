#!/usr/bin/env bash
# Weak scaling of dptrain's DDP beside PyTorch DDP, same GPUs, same run: `dpt-bench scaling` (1, 2, 4, ... N
# GPUs, bucket sweep, step-time model, CSV/Markdown/PNG per workload), what users run (dpt-train with the
# shipped configs/bench_<workload>.yaml and default settings at the same GPU counts: the median logged
# throughput per GPU, the first interval left out) and bench/pytorch_reference.py under torchrun at the same
# counts, in each of PyTorch's modes (eager, torch.compile, and torch.compile with CUDA graphs: mode
# reduce-overhead, shown as pytorch-graphs; each in a fresh process): the ratios are against the fastest of
# them at each count. Prints the efficiency table last, a column per GPU count. Build first
# (scripts/gpu-test.sh builds build-gpu/). torch.compile adds about a minute a run: on a machine with a
# per-command time limit, run one workload at a time.
#
#   scripts/gpu-scaling.sh                                     # mlp_92m tiny_gpt gpt2_124m on every GPU
#   DPT_SCALING_WORKLOADS=mlp_92m DPT_SCALING_SWEEP=5,25 scripts/gpu-scaling.sh
#   DPT_SCALING_ARGS="--zero" scripts/gpu-scaling.sh           # extra options for dpt-bench train
#   DPT_SCALING_TORCH_MODES=eager scripts/gpu-scaling.sh       # PyTorch eager only (quick)
#   scripts/gpu-scaling.sh --table-only                        # the table again, from an earlier run's files
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bin="${DPT_BUILD_DIR:-$root/build-gpu}/bin"
out="${OUT:-${DPT_BUILD_DIR:-$root/build-gpu}}/scaling"
workloads="${DPT_SCALING_WORKLOADS:-mlp_92m tiny_gpt gpt2_124m}"
steps="${DPT_SCALING_STEPS:-30}"
sweep="${DPT_SCALING_SWEEP:-5,25,100}"
torch_modes="${DPT_SCALING_TORCH_MODES:-eager compile reduce-overhead}"
ref="$out/pytorch.jsonl"
defaults="$out/dpt-train.jsonl"

# count_up_to GPUS: dpt-bench scaling's counts, 1, 2, 4, ... up to the GPUs, and the GPUs themselves.
count_up_to() {
  counts=()
  for ((n = 1; n <= $1; n *= 2)); do counts+=("$n"); done
  ((counts[-1] == $1)) || counts+=("$1")
}

# table: the efficiency table of the files in $out, a column per count.
table() {
python3 - "$out" "$ref" "$defaults" "${counts[*]}" $workloads <<'PY'
import csv, json, sys
out, ref, defaults, counts, workloads = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4].split(), sys.argv[5:]
counts = [int(n) for n in counts]
torch_rows = [json.loads(l) for l in open(ref) if l.startswith("{")]
train_rows = [json.loads(l) for l in open(defaults) if l.startswith("{")]
print(f"\n=== weak scaling, {' -> '.join(map(str, counts))} GPUs, per-GPU batch fixed, same machine, same run ===")
print("throughput per GPU at each count, then efficiency (per-GPU throughput over one GPU's)")
print(f"{'workload':<10} {'system':<19} " + " ".join(f"{f'{n} GPU':>11}" for n in counts) + " " +
      " ".join(f"{f'eff {n}':>8}" for n in counts[1:]))


def line(w, system, per_gpu):  # per_gpu: {count: throughput per GPU}
    cells = " ".join(f"{per_gpu[n]:>11.0f}" if n in per_gpu else f"{'-':>11}" for n in counts)
    base = per_gpu.get(1)
    effs = " ".join(f"{100 * per_gpu[n] / base:>7.1f}%" if base and n in per_gpu else f"{'-':>8}" for n in counts[1:])
    print(f"{w:<10} {system:<19} {cells} {effs}")


for w in workloads:
    try:
        rows = list(csv.DictReader(open(f"{out}/{w}/scaling.csv")))
    except OSError:
        print(f"{w:<10} dptrain: no result (see the log above)")
        continue
    ours = {}
    for r in rows:  # a count's first row is at the default bucket size; the bucket sweep's rows come later
        ours.setdefault(int(r["gpus"]), float(r["throughput_per_gpu"]))
    line(w, "dpt-bench", ours)
    trained = {r["world"]: r["throughput"] for r in train_rows if r["workload"] == w}
    line("", "dpt-train defaults", trained)
    modes = {}  # PyTorch's mode ("pytorch-eager", "pytorch-compile", "pytorch-graphs") -> {count: throughput per GPU}
    for r in torch_rows:
        if r["workload"] == w:
            mode = r["system"].removesuffix("+ddp").replace("compile-reduce-overhead", "graphs")
            modes.setdefault(mode, {})[r.get("world", 1)] = r["throughput"]
    for mode, per_gpu in modes.items():
        line("", mode + " DDP", per_gpu)
    fastest = {n: max(m[n] for m in modes.values() if n in m) for n in counts if any(n in m for m in modes.values())}
    for name, mine in (("dpt-bench", ours), ("dpt-train", trained)):
        ratio = " ".join(f"{mine[n] / fastest[n]:>10.2f}x" if n in mine and n in fastest else f"{'-':>11}"
                         for n in counts)
        print(f"{'':<10} {name + ' / PyTorch':<19} {ratio}  (against PyTorch's fastest mode at each count)")
    at_most = [r for r in rows if int(r["gpus"]) == counts[-1]]
    if len(at_most) > 1:
        best = max(at_most, key=lambda r: float(r["efficiency_pct"]))
        print(f"{'':<10} best bucket at {counts[-1]} GPUs: {float(best['bucket_cap_mb']):.0f} MB, "
              f"{float(best['efficiency_pct']):.1f}%")
PY
}

if [[ "${1:-}" == "--table-only" ]]; then
  [[ -f "$ref" && -f "$defaults" ]] || { echo "gpu-scaling: no earlier run in $out" >&2; exit 2; }
  # The counts up to the largest world in the files, and the workloads they name, unless set.
  rows='import json, sys; rows = [json.loads(l) for f in sys.argv[1:] for l in open(f) if l.startswith("{")]'
  count_up_to "${DPT_SCALING_GPUS:-$(python3 -c "$rows; print(max([1] + [r.get('world', 1) for r in rows]))" "$ref" "$defaults")}"
  workloads="${DPT_SCALING_WORKLOADS:-$(python3 -c "$rows; print(*dict.fromkeys(r['workload'] for r in rows))" "$ref" "$defaults")}"
  table
  exit
elif (($#)); then
  echo "usage: scripts/gpu-scaling.sh [--table-only]  (settings: DPT_SCALING_* variables, see the header)" >&2
  exit 2
fi

gpus="${DPT_SCALING_GPUS:-$(nvidia-smi -L | wc -l)}"
count_up_to "$gpus"
# NVLink multicast off, .deps on the library path, the same NCCL as PyTorch (scripts/gpu-env.sh).
source "$root/scripts/gpu-env.sh"
mkdir -p "$out"
: >"$ref"
: >"$defaults"

# train_defaults WORKLOAD GPUS: appends {"workload", "world", "throughput"} (per GPU) of a dpt-train run with
# default settings.
train_defaults() {
  local run="$out/dpt-train_$1_$2" steps=400 every=20
  [[ "$1" != gpt2_124m ]] || steps=80 every=10
  local cmd=("$bin/dpt-train" -c "$root/configs/bench_$1.yaml" "training.steps=$steps" "logging.every=$every"
    "checkpoint.dir=$run")
  ((${2} == 1)) || cmd=("$bin/dpt-run" --standalone --nproc-per-node "$2" -- "${cmd[@]}")
  rm -rf "$run"
  timeout 300 "${cmd[@]}" >"$run.log" 2>&1 || echo "dpt-train $1 on $2 GPU(s) failed: see $run.log"
  local per_gpu
  per_gpu="$(python3 "$root/bench/logged.py" median "$run/metrics.jsonl" throughput_per_gpu)"
  [[ "$per_gpu" == NA ]] || echo "{\"workload\": \"$1\", \"world\": $2, \"throughput\": $per_gpu}" >>"$defaults"
}

for w in $workloads; do
  timeout 600 "$bin/dpt-bench" scaling --workload "$w" ${DPT_SCALING_ARGS:+"--train-args=$DPT_SCALING_ARGS"} \
    --max-gpus "$gpus" --steps "$steps" --warmup 5 --bucket-sweep "$sweep" --out "$out/$w" | tail -n 30
  for n in "${counts[@]}"; do train_defaults "$w" "$n"; done
  for mode in $torch_modes; do
    case "$mode" in
      eager) mode_args=() ;;
      compile) mode_args=(--compile) ;;
      *) mode_args=(--compile --compile-mode "$mode") ;;
    esac
    for n in "${counts[@]}"; do
      PYTHONUNBUFFERED=1 timeout 600 torchrun --standalone --nproc-per-node "$n" "$root/bench/pytorch_reference.py" \
        --workload "$w" --steps "$steps" --warmup 5 "${mode_args[@]}" 2>"$out/pytorch_${w}_${mode}_$n.err" |
        grep '^{' >>"$ref" || echo "PyTorch $mode on $w, $n GPU(s): no result (see $out/pytorch_${w}_${mode}_$n.err)"
    done
  done
done

table
