#!/usr/bin/env bash
# Shows that dptrain trains like PyTorch: for each workload, `dpt-bench train --save-start` writes the
# initial parameters and the batch, `bench/pytorch_reference.py --start` trains from exactly those, both
# print every step's loss (--losses), and the table last compares the two curves step by step. Under bf16
# the bar is a relative difference within 1% at every step (DPT_CONV_TOLERANCE); the exit status is 1
# when a workload misses it or did not run. Build first (scripts/gpu-test.sh builds into build-gpu/).
#
#   scripts/gpu-convergence.sh                                   # tiny_gpt gpt2_124m mlp_92m, 30 steps, bf16
#   DPT_CONV_WORKLOADS="tiny_gpt" DPT_CONV_STEPS=100 scripts/gpu-convergence.sh
#   DPT_CONV_PRECISION=fp32 scripts/gpu-convergence.sh           # --precision for both
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bin="${DPT_BUILD_DIR:-$root/build-gpu}/bin"
out="${OUT:-${DPT_BUILD_DIR:-$root/build-gpu}}/convergence"
workloads="${DPT_CONV_WORKLOADS:-tiny_gpt gpt2_124m mlp_92m}"
steps="${DPT_CONV_STEPS:-30}"
tolerance="${DPT_CONV_TOLERANCE:-0.01}"
precision=()
[[ -n "${DPT_CONV_PRECISION:-}" ]] && precision=(--precision "$DPT_CONV_PRECISION")
# NVLink multicast off, .deps on the library path, the same NCCL as PyTorch (scripts/gpu-env.sh).
source "$root/scripts/gpu-env.sh"
mkdir -p "$out"

for w in $workloads; do
  rm -f "$out/$w.start.safetensors" "$out/$w.dptrain.jsonl" "$out/$w.pytorch.jsonl"
  timeout 300 "$bin/dpt-bench" train --workload "$w" --steps "$steps" --warmup 0 "${precision[@]}" \
    --save-start "$out/$w.start.safetensors" --losses | tee "$out/$w.dptrain.jsonl" | grep -v '^{'
  [[ -f "$out/$w.start.safetensors" ]] || { echo "$w: dpt-bench wrote no start file"; continue; }
  PYTHONUNBUFFERED=1 timeout 600 python3 "$root/bench/pytorch_reference.py" --workload "$w" --steps "$steps" \
    --warmup 0 "${precision[@]}" --start "$out/$w.start.safetensors" --losses | tee "$out/$w.pytorch.jsonl" |
    grep -v '^{'
done

python3 - "$out" "$tolerance" "${DPT_CONV_PRECISION:-bf16}" $workloads <<'PY'
import json, math, os, sys
out, tol, precision, workloads = sys.argv[1], float(sys.argv[2]), sys.argv[3], sys.argv[4:]

def losses(w, system):
    path = os.path.join(out, f"{w}.{system}.jsonl")
    if not os.path.exists(path):
        return None
    rows = [json.loads(l) for l in open(path) if l.startswith("{")]
    return rows[-1].get("losses") if rows else None

ok = True
verdicts = []
for w in workloads:
    ours, ref = losses(w, "dptrain"), losses(w, "pytorch")
    print(f"\n=== {w}: dptrain vs PyTorch loss, same start (weights and batch), {precision} ===")
    if not ours or not ref or len(ours) != len(ref):
        print(f"missing or unequal loss lists: dptrain {len(ours or [])}, PyTorch {len(ref or [])} steps")
        verdicts.append(f"{w}: NO RESULT")
        ok = False
        continue
    print(f"{'step':>5} {'dptrain':>12} {'PyTorch':>12} {'rel diff':>10}")
    worst, worst_step = 0.0, 0
    for i, (a, b) in enumerate(zip(ours, ref)):
        rel = abs(a - b) / abs(b) if b != 0 else (0.0 if a == 0 else math.inf)
        if math.isnan(rel):
            rel = math.inf
        if rel > worst:
            worst, worst_step = rel, i
        print(f"{i:>5} {a:>12.6f} {b:>12.6f} {100 * rel:>9.4f}%")
    print(f"max relative difference {100 * worst:.4f}% (step {worst_step})")
    passed = worst <= tol
    ok &= passed
    verdicts.append(f"{w}: {'PASS' if passed else 'FAIL'} (max {100 * worst:.4f}%)")
print(f"\n=== verdict: {'PASS' if ok else 'FAIL'}: every step within {100 * tol:g}% of PyTorch ===")
for v in verdicts:
    print("  " + v)
sys.exit(0 if ok else 1)
PY
