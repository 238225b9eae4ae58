#!/usr/bin/env bash
# Runs `dpt-bench train` (eagerly, and with the step captured in a CUDA graph: --cuda-graph) and the
# PyTorch reference (bench/pytorch_reference.py) for the same workloads on the same GPU in one go, and
# prints the ratio table last. Build first (scripts/gpu-test.sh builds into build-gpu/).
#
#   scripts/gpu-bench.sh                                   # tiny_gpt mlp_92m gpt2_124m, PyTorch eager
#   DPT_BENCH_COMPILE=1 scripts/gpu-bench.sh               # also torch.compile (slow to compile)
#   DPT_BENCH_WORKLOADS="tiny_gpt" DPT_BENCH_STEPS=50 scripts/gpu-bench.sh
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bin="${DPT_BUILD_DIR:-$root/build-gpu}/bin"
out="${OUT:-${DPT_BUILD_DIR:-$root/build-gpu}}/bench.jsonl"
workloads="${DPT_BENCH_WORKLOADS:-tiny_gpt mlp_92m gpt2_124m}"
steps="${DPT_BENCH_STEPS:-20}"
# NVLink multicast off, .deps on the library path, the same NCCL as PyTorch (scripts/gpu-env.sh).
source "$root/scripts/gpu-env.sh"
: >"$out"

for w in $workloads; do
  for mode in "" --cuda-graph; do
    timeout 300 "$bin/dpt-bench" train --workload "$w" --steps "$steps" --warmup 3 $mode | tee -a "$out" |
      grep -v '^{'
  done
done
ref_args=(--steps "$steps" --warmup 3)
for w in $workloads; do ref_args+=(--workload "$w"); done
PYTHONUNBUFFERED=1 timeout 600 python3 "$root/bench/pytorch_reference.py" "${ref_args[@]}" | grep '^{' >>"$out"
if [[ "${DPT_BENCH_COMPILE:-0}" == 1 ]]; then
  PYTHONUNBUFFERED=1 timeout 900 python3 "$root/bench/pytorch_reference.py" "${ref_args[@]}" --compile | grep '^{' >>"$out"
fi

python3 - "$out" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
ours = [r for r in rows if r["system"].startswith("dptrain")]
theirs = [r for r in rows if not r["system"].startswith("dptrain")]
print(f"\n=== dptrain vs PyTorch, same GPU, same run ({rows[0]['device'] if rows else '?'}) ===")
print(f"{'workload':<11} {'system':<16} {'throughput':>12} {'step ms':>8} {'MFU':>6} {'peak GiB':>8}  ratios (dptrain / PyTorch)")
for w in dict.fromkeys(r["workload"] for r in rows):
    refs = [r for r in theirs if r["workload"] == w]
    for r in [r for r in ours if r["workload"] == w] + refs:
        ratios = "" if r in refs else "  ".join(f"{t['system']} {r['throughput'] / t['throughput']:.2f}x" for t in refs)
        print(f"{w:<11} {r['system']:<16} {r['throughput']:>12.0f} {r['step_ms']:>8.2f} {100 * r['mfu']:>5.1f}% "
              f"{r['peak_mem_gib']:>8.2f}  {ratios}")
PY
