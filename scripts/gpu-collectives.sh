#!/usr/bin/env bash
# AllReduce bus bandwidth and latency of `dpt-bench collectives` (NCCL) beside PyTorch's dist.all_reduce,
# same GPUs, same run, same timing method (CUDA events on the caller's stream, median); prints the ratio
# table last. Build first (scripts/gpu-test.sh builds build-gpu/).
#
#   scripts/gpu-collectives.sh                     # float32, 1 KiB .. 1 GiB, every GPU
#   DPT_COLL_ITERS=100 DPT_COLL_DTYPE=bf16 scripts/gpu-collectives.sh
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bin="${DPT_BUILD_DIR:-$root/build-gpu}/bin"
out="${OUT:-${DPT_BUILD_DIR:-$root/build-gpu}}/collectives"
gpus="${DPT_COLL_GPUS:-$(nvidia-smi -L | wc -l)}"
iters="${DPT_COLL_ITERS:-50}"
dtype="${DPT_COLL_DTYPE:-f32}"
# NVLink multicast off, .deps on the library path, the same NCCL as PyTorch (scripts/gpu-env.sh).
source "$root/scripts/gpu-env.sh"
mkdir -p "$out"
common=(--ops allreduce --min-bytes 1K --max-bytes 1G --dtype "$dtype" --warmup 10 --iters "$iters")

timeout 600 "$bin/dpt-run" --standalone --nproc-per-node "$gpus" -- "$bin/dpt-bench" collectives --backend nccl \
  "${common[@]}" --csv "$out/dptrain.csv" >"$out/dptrain.log" 2>&1 || { tail -n 20 "$out/dptrain.log"; exit 1; }
# The same on the communication stream (async_op): what an overlapped collective costs, for reference.
timeout 600 "$bin/dpt-run" --standalone --nproc-per-node "$gpus" -- "$bin/dpt-bench" collectives --backend nccl \
  "${common[@]}" --async-op on --csv "$out/dptrain_async.csv" >"$out/dptrain_async.log" 2>&1 ||
  { tail -n 20 "$out/dptrain_async.log"; exit 1; }
PYTHONUNBUFFERED=1 timeout 600 torchrun --standalone --nproc-per-node "$gpus" "$root/apps/bench/pytorch_collectives.py" \
  "${common[@]}" --csv "$out/pytorch.csv" >"$out/pytorch.log" 2>&1 || { tail -n 20 "$out/pytorch.log"; exit 1; }

python3 - "$out/dptrain.csv" "$out/pytorch.csv" "$gpus" "$out/dptrain_async.csv" <<'PY'
import csv, sys
def load(path):
    return {int(r["bytes"]): r for r in csv.DictReader(open(path)) if r["op"] == "allreduce"}
ours, ref, n, overlapped = load(sys.argv[1]), load(sys.argv[2]), sys.argv[3], load(sys.argv[4])
print(f"\n=== AllReduce, {n} GPUs, dptrain vs PyTorch, same run ===")
print(f"{'bytes':>12} {'dptrain us':>11} {'PyTorch us':>11} {'dptrain GB/s':>13} {'PyTorch GB/s':>13} {'busbw ratio':>11}"
      f" {'async_op us':>12}")
for b in sorted(ours):
    if b not in ref: continue
    o, r = ours[b], ref[b]
    a = f"{float(overlapped[b]['time_us']):>12.1f}" if b in overlapped else f"{'-':>12}"
    print(f"{b:>12} {float(o['time_us']):>11.1f} {float(r['time_us']):>11.1f} {float(o['busbw_GBps']):>13.1f} "
          f"{float(r['busbw_GBps']):>13.1f} {float(o['busbw_GBps']) / max(float(r['busbw_GBps']), 1e-9):>10.3f}x {a}")
PY
