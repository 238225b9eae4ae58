#!/usr/bin/env bash
# Weak scaling of dptrain's DDP beside PyTorch DDP, same GPUs, same run: `dpt-bench scaling` (1 and N GPUs,
# bucket sweep, step-time model, CSV/Markdown/PNG per workload), what users run (dpt-train with the shipped
# configs/bench_<workload>.yaml and default settings at 1 and N GPUs: the median logged throughput per GPU,
# the first interval left out) and bench/pytorch_reference.py under torchrun at 1 and N processes. Prints the
# efficiency table last. Build first (scripts/gpu-test.sh builds build-gpu/).
#
#   scripts/gpu-scaling.sh                                     # mlp_92m tiny_gpt gpt2_124m on every GPU
#   DPT_SCALING_WORKLOADS=mlp_92m DPT_SCALING_SWEEP=5,25 scripts/gpu-scaling.sh
#   DPT_SCALING_ARGS="--zero" scripts/gpu-scaling.sh           # extra options for dpt-bench train
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bin="${DPT_BUILD_DIR:-$root/build-gpu}/bin"
out="${OUT:-${DPT_BUILD_DIR:-$root/build-gpu}}/scaling"
workloads="${DPT_SCALING_WORKLOADS:-mlp_92m tiny_gpt gpt2_124m}"
steps="${DPT_SCALING_STEPS:-30}"
sweep="${DPT_SCALING_SWEEP:-5,25,100}"
gpus="${DPT_SCALING_GPUS:-$(nvidia-smi -L | wc -l)}"
# NVLink multicast off, .deps on the library path, the same NCCL as PyTorch (scripts/gpu-env.sh).
source "$root/scripts/gpu-env.sh"
mkdir -p "$out"
ref="$out/pytorch.jsonl"
defaults="$out/dpt-train.jsonl"
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
  python3 - "$1" "$2" "$run/metrics.jsonl" >>"$defaults" <<'PY'
import json, statistics, sys
w, n, path = sys.argv[1], int(sys.argv[2]), sys.argv[3]
try:
    per_gpu = [r["throughput_per_gpu"] for r in map(json.loads, open(path))
               if r.get("type") == "train" and r.get("throughput_per_gpu")][1:]
except OSError:
    per_gpu = []
if per_gpu:
    print(json.dumps({"workload": w, "world": n, "throughput": statistics.median(per_gpu)}))
PY
}

for w in $workloads; do
  timeout 600 "$bin/dpt-bench" scaling --workload "$w" ${DPT_SCALING_ARGS:+"--train-args=$DPT_SCALING_ARGS"} \
    --max-gpus "$gpus" --steps "$steps" --warmup 5 --bucket-sweep "$sweep" --out "$out/$w" | tail -n 30
  for n in 1 "$gpus"; do train_defaults "$w" "$n"; done
  for n in 1 "$gpus"; do
    PYTHONUNBUFFERED=1 timeout 300 torchrun --standalone --nproc-per-node "$n" "$root/bench/pytorch_reference.py" \
      --workload "$w" --steps "$steps" --warmup 5 2>"$out/pytorch_${w}_$n.err" | grep '^{' >>"$ref"
  done
done

python3 - "$out" "$ref" "$gpus" "$defaults" $workloads <<'PY'
import csv, json, sys
out, ref, n, defaults, workloads = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5:]
torch_rows = [json.loads(l) for l in open(ref) if l.startswith("{")]
train_rows = [json.loads(l) for l in open(defaults) if l.startswith("{")]
print(f"\n=== weak scaling, 1 -> {n} GPUs, per-GPU batch fixed, same machine, same run ===")
print(f"{'workload':<10} {'system':<18} {'1 GPU':>11} {f'{n} GPUs/GPU':>11} {'efficiency':>10}  best bucket")
for w in workloads:
    try:
        rows = list(csv.DictReader(open(f"{out}/{w}/scaling.csv")))
    except OSError:
        print(f"{w:<10} dptrain: no result (see the log above)")
        continue
    one = [r for r in rows if int(r["gpus"]) == 1][0]
    many = [r for r in rows if int(r["gpus"]) == n]
    default = many[0] if many else one
    best = max(many, key=lambda r: float(r["efficiency_pct"])) if many else one
    print(f"{w:<10} {'dptrain':<18} {float(one['throughput_per_gpu']):>11.0f} {float(default['throughput_per_gpu']):>11.0f} "
          f"{float(default['efficiency_pct']):>9.1f}%  {float(best['bucket_cap_mb']):.0f} MB: {float(best['efficiency_pct']):.1f}%")
    d1 = [r["throughput"] for r in train_rows if r["workload"] == w and r["world"] == 1]
    dn = [r["throughput"] for r in train_rows if r["workload"] == w and r["world"] == n]
    if d1 and dn:
        print(f"{'':<10} {'dpt-train defaults':<18} {d1[0]:>11.0f} {dn[0]:>11.0f} {100 * dn[0] / d1[0]:>9.1f}%")
    t1 = [r for r in torch_rows if r["workload"] == w and r.get("world", 1) == 1]
    tn = [r for r in torch_rows if r["workload"] == w and r.get("world", 1) == n]
    if t1 and tn:
        print(f"{'':<10} {tn[0]['system']:<18} {t1[0]['throughput']:>11.0f} {tn[0]['throughput']:>11.0f} "
              f"{100 * tn[0]['throughput'] / t1[0]['throughput']:>9.1f}%")
        print(f"{'':<10} {'dptrain / PyTorch':<18} {float(one['throughput_per_gpu']) / t1[0]['throughput']:>10.2f}x "
              f"{float(default['throughput_per_gpu']) / tn[0]['throughput']:>10.2f}x")
PY
