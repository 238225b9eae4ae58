#!/usr/bin/env bash
# What users run against what dpt-bench measures, same GPUs, one run after another: dpt-train with the
# shipped configs/bench_<workload>.yaml and default settings (the step replayed from a CUDA graph) and with
# training.cuda_graph=false, beside `dpt-bench train` eagerly and with --cuda-graph, on 1 and 2 GPUs.
# dpt-train's step is the median of the step times it logs (the first interval left out); dpt-bench's is its
# median step after warm-up. dpt-bench runs each workload with the flags that scale it best on several GPUs
# (docs/benchmarks.md): the tiny GPT updates inside backward on any count, the MLP gathers gradients and
# GPT-2 shards with ZeRO-1 on the copy engines on several GPUs. Prints the Markdown table last; the ratio
# columns are dpt-train over dpt-bench. Build first (scripts/gpu-test.sh builds build-gpu/).
#
#   scripts/gpu-train-vs-bench.sh                                   # tiny_gpt mlp_92m gpt2_124m, 1 and 2 GPUs
#   DPT_TVB_WORKLOADS=mlp_92m DPT_TVB_GPUS="1 4" scripts/gpu-train-vs-bench.sh
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bin="${DPT_BUILD_DIR:-$root/build-gpu}/bin"
out="${OUT:-${DPT_BUILD_DIR:-$root/build-gpu}}/train-vs-bench"
workloads="${DPT_TVB_WORKLOADS:-tiny_gpt mlp_92m gpt2_124m}"
gpu_counts="${DPT_TVB_GPUS:-1 2}"
# NVLink multicast off, .deps on the library path, the same NCCL as PyTorch (scripts/gpu-env.sh).
source "$root/scripts/gpu-env.sh"
mkdir -p "$out"
results="$out/results.tsv"
: >"$results"

best_flags() {  # best_flags WORKLOAD GPUS
  case "$1:$2" in
    tiny_gpt:*) echo --overlap-optimizer ;;
    mlp_92m:1 | gpt2_124m:1) ;;
    mlp_92m:*) echo --gathered-grads --copy-engines ;;
    gpt2_124m:*) echo --zero --updates-when-reduced --copy-engines ;;
  esac
}

launch() {  # launch GPUS COMMAND...: the command itself on one GPU, under dpt-run on several
  local n="$1"
  shift
  if ((n == 1)); then "$@"; else "$bin/dpt-run" --standalone --nproc-per-node "$n" -- "$@"; fi
}

train_ms() {  # train_ms WORKLOAD GPUS TAG [OVERRIDE...]: dpt-train's median logged step (ms), or NA
  local w="$1" n="$2" run="$out/train_$1_$2_$3" steps=400 every=20
  shift 3
  [[ "$w" != gpt2_124m ]] || steps=80 every=10
  rm -rf "$run"
  launch "$n" "$bin/dpt-train" -c "$root/configs/bench_$w.yaml" "training.steps=$steps" "logging.every=$every" \
    "checkpoint.dir=$run" "$@" >"$run.log" 2>&1
  python3 "$root/bench/logged.py" median "$run/metrics.jsonl" step_ms
}

# dpt-bench runs as long as dpt-train and leaves out as many first steps: a GPU kept at full load settles
# within seconds at a lower clock under its power limit, so a shorter benchmark run would be timed at a
# clock that a training run does not keep (docs/benchmarks.md).
bench_ms() {  # bench_ms WORKLOAD GPUS [FLAG...]: dpt-bench train's median step (ms), or NA
  local w="$1" n="$2" steps=380 warmup=20
  shift 2
  [[ "$w" != gpt2_124m ]] || { steps=70; warmup=10; }
  local log="$out/bench_${w}_${n}_$#.log"
  # shellcheck disable=SC2046  # the flags are words
  launch "$n" "$bin/dpt-bench" train --workload "$w" --steps "$steps" --warmup "$warmup" $(best_flags "$w" "$n") "$@" \
    >"$log" 2>&1
  python3 "$root/bench/logged.py" bench "$log"
}

for w in $workloads; do
  for n in $gpu_counts; do
    row=("$w" "$n" "$(train_ms "$w" "$n" graph)" "$(train_ms "$w" "$n" eager training.cuda_graph=false)"
      "$(bench_ms "$w" "$n")" "$(bench_ms "$w" "$n" --cuda-graph)")
    (IFS=$'\t'; echo "${row[*]}") | tee -a "$results"
  done
done

python3 - "$results" "$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1)" <<'PY'
import sys
print(f"\n=== dpt-train (defaults) against dpt-bench train, same machine, one run after another ({sys.argv[2]}) ===")
print("| workload | GPUs | dpt-train | dpt-train eager | dpt-bench eager | dpt-bench graph "
      "| dpt-train / dpt-bench graph | eager / eager |")
print("| --- | --- | --- | --- | --- | --- | --- | --- |")
for line in open(sys.argv[1]):
    w, n, train, train_eager, bench_eager, bench_graph = line.split()
    def ratio(a, b):
        try:
            return f"{float(a) / float(b):.3f}x"
        except ValueError:
            return "NA"
    print(f"| {w} | {n} | {train} ms | {train_eager} ms | {bench_eager} ms | {bench_graph} ms "
          f"| {ratio(train, bench_graph)} | {ratio(train_eager, bench_eager)} |")
PY
