#!/usr/bin/env bash
# Runs `dpt-bench train` (eagerly, and with the step captured in a CUDA graph: --cuda-graph) and the
# PyTorch reference (bench/pytorch_reference.py) for the same workloads on the same GPU in one go, and
# prints the ratio table last. Build first (scripts/gpu-test.sh builds into build-gpu/).
#
# PyTorch runs at its best: every workload in each mode (eager, torch.compile, and torch.compile with
# CUDA graphs: mode reduce-overhead) and each bf16 scheme (torch.autocast, and --bf16 pure: a bf16 model
# with float32 masters, the arithmetic dptrain does) in a fresh process of its own, and every ratio is
# against the fastest of them as well as against each.
#
#   scripts/gpu-bench.sh                                   # tiny_gpt mlp_92m gpt2_124m
#   DPT_BENCH_MODES="eager" DPT_BENCH_BF16=autocast scripts/gpu-bench.sh   # PyTorch eager autocast only (quick)
#   DPT_BENCH_WORKLOADS="tiny_gpt" DPT_BENCH_STEPS=50 scripts/gpu-bench.sh
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bin="${DPT_BUILD_DIR:-$root/build-gpu}/bin"
out="${OUT:-${DPT_BUILD_DIR:-$root/build-gpu}}/bench.jsonl"
workloads="${DPT_BENCH_WORKLOADS:-tiny_gpt mlp_92m gpt2_124m}"
modes="${DPT_BENCH_MODES:-eager compile reduce-overhead}"
schemes="${DPT_BENCH_BF16:-autocast pure}"
steps="${DPT_BENCH_STEPS:-20}"
# NVLink multicast off, .deps on the library path, the same NCCL as PyTorch (scripts/gpu-env.sh).
source "$root/scripts/gpu-env.sh"
export DPT_TRAIN="$bin/dpt-train"  # the reference reads its workloads from configs/bench_*.yaml through it
: >"$out"

for w in $workloads; do
  for mode in "" --cuda-graph; do
    timeout 300 "$bin/dpt-bench" train --workload "$w" --steps "$steps" --warmup 3 $mode | tee -a "$out" |
      grep -v '^{'
  done
  for mode in $modes; do
    case "$mode" in
      eager) mode_args=() ;;
      compile) mode_args=(--compile) ;;
      *) mode_args=(--compile --compile-mode "$mode") ;;
    esac
    for scheme in $schemes; do
      PYTHONUNBUFFERED=1 timeout 900 python3 "$root/bench/pytorch_reference.py" --workload "$w" --steps "$steps" \
        --warmup 3 --bf16 "$scheme" "${mode_args[@]}" | grep '^{' >>"$out" ||
        echo "PyTorch $mode ($scheme bf16) on $w: no result"
    done
  done
done

python3 - "$out" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
ours = [r for r in rows if r["system"].startswith("dptrain")]
theirs = [r for r in rows if not r["system"].startswith("dptrain")]
print(f"\n=== dptrain vs PyTorch, same GPU, same run ({rows[0]['device'] if rows else '?'}) ===")
print(f"{'workload':<11} {'system':<32} {'throughput':>12} {'step ms':>8} {'MFU':>6} {'peak GiB':>8}  ratios (dptrain / PyTorch)")
for w in dict.fromkeys(r["workload"] for r in rows):
    refs = [r for r in theirs if r["workload"] == w]
    best = max(refs, key=lambda r: r["throughput"]) if refs else None
    for r in [r for r in ours if r["workload"] == w] + refs:
        ratios = "" if r in refs else "  ".join(f"{t['system']} {r['throughput'] / t['throughput']:.2f}x" for t in refs)
        if best and r not in refs:
            ratios = f"vs fastest ({best['system']}) {r['throughput'] / best['throughput']:.2f}x   " + ratios
        print(f"{w:<11} {r['system']:<32} {r['throughput']:>12.0f} {r['step_ms']:>8.2f} {100 * r['mfu']:>5.1f}% "
              f"{r['peak_mem_gib']:>8.2f}  {ratios}")
PY
