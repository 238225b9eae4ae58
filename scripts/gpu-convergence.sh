#!/usr/bin/env bash
# Shows that dptrain trains like PyTorch, measured against how far PyTorch is from itself.
#
# For each workload x precision x GPU count x batch mode, `dpt-bench train --save-start FILE --losses`
# writes the initial parameters and every batch it trains on (each rank's, each step's) and prints every
# step's loss; `bench/pytorch_reference.py --start-file FILE --losses --floor KINDS` trains from exactly those
# (the reference) and then once more for each floor kind with only that changed (the floor runs). Two
# GPUs: dpt-bench under dpt-run against PyTorch DDP under torchrun, 2 processes each, rank 0's loss on
# both sides. bf16 references compute as dptrain does (`--bf16 pure`: bf16 parameters and activations,
# float32 masters); torch.autocast keeps the residual stream in float32, which is other arithmetic.
#
# The floor runs, PyTorch against itself from the same start:
#   fp32  cpu      the reference on the GPU against the same run on the CPU (every core; under torchrun
#                  each rank half of them, DDP over Gloo)
#         kernels  other GPU kernels: deterministic algorithms, cuBLASLt for every matmul, another attention
#                  backend (math in float32, memory-efficient in bf16); gpt2_124m's fp32 stand-in for cpu,
#                  whose 100 CPU steps would take tens of minutes
#   bf16  compile  the eager reference against torch.compile (other fused kernels, same arithmetic)
#         flash    GPTs: attention through PyTorch's FlashAttention backend, where the reference takes PyTorch's
#                  default (cuDNN's on an H200 with PyTorch 2.11): near-uniform attention at a GPT's first steps
#                  makes the backend's arithmetic the largest choice PyTorch itself leaves open
#   any   order    every batch's examples reversed: the same sums in another order; order:N a random
#                  permutation from seed N
#   MLP   units:N  the input features and hidden units permuted from seed N: the same function, every
#                  matmul (the forward's too) summing in another order
# One run says little once training turns chaotic: a repeated batch makes the loss spike after a few
# steps, and a ReLU whose input lies within rounding of zero passes or blocks a whole example's gradient,
# so two correct runs jump apart by chance. The floor is therefore the farthest of several runs, step by
# step (DPT_CONV_FLOOR_FP32, DPT_CONV_FLOOR_FP32_GPT2, DPT_CONV_FLOOR_BF16: comma-separated kinds; a GPT's bf16
# defaults add flash, and order:3 to order:16 with a repeated batch; an MLP's add units:1 to units:16).
#
# The bar, step by step: with gap(t) = |dptrain(t) - PyTorch(t)| / |PyTorch(t)| and floor(t) = the
# largest |floor run(t) - PyTorch(t)| / |PyTorch(t)| over the floor runs, every step s must have
#   max_{t<=s} gap(t) <= 2 * max_{t<=s} floor(t) + 1e-6.
# ratio = the largest max_{t<=s} gap / (max_{t<=s} floor + 5e-7) over the steps: PASS when ratio <= 2.
# The table last gives each combination's floor and gap (largest over the steps), the step of its largest
# ratio, the ratio and PASS/FAIL; a failing one also gets the first step that misses the bar. Per-step
# curves go to $OUT/convergence/<combination>.csv and all of them to convergence.csv (for plots). The exit
# status is 1 when any combination misses the bar or produced no losses; 2-GPU rows are skipped, and said
# so, when fewer GPUs are visible (nvidia-smi -L). Build first (scripts/gpu-test.sh builds build-gpu/).
#
#   scripts/gpu-convergence.sh                          # the default set below, ~20 min on one H100
#   DPT_CONV_WORKLOADS=mlp_92m DPT_CONV_PRECISIONS=fp32 DPT_CONV_BATCHES=random scripts/gpu-convergence.sh
#   DPT_CONV_EXCLUDE="gpt2_124m:fp32:*:random" scripts/gpu-convergence.sh  # without GPT-2's slowest rows
#
# DPT_CONV_WORKLOADS  tiny_gpt mlp_92m gpt2_124m     DPT_CONV_STEPS    100
#                     (any NAME with a configs/bench_NAME.yaml: a shape of your own is one YAML file)
# DPT_CONV_PRECISIONS fp32 bf16                      DPT_CONV_GPUS     1 2
# DPT_CONV_BATCHES    repeat random (one batch for every step, or a fresh one each step)
# DPT_CONV_EXCLUDE    workload:precision:gpus:batches patterns left out (default none; GPT-2 fp32 with random
#                     batches is the slowest combination, about four minutes on one H100)
# DPT_CONV_DEADLINE_S no combination starts after this many seconds (default: no limit); those left count as
#                     without a result, so that a run under a time limit still ends with its table
# DPT_CONV_JOBS       combinations run at once (default 1), each on GPUs of its own: the visible GPUs are
#                     cut into that many groups (4 GPUs, 2 jobs: GPUs 0-1 and 2-3), a combination waits for a
#                     free group, and one needing more GPUs than a group has is skipped. The host's cores
#                     are cut alike, so that the CPU floor runs of two jobs do not share cores. A
#                     combination's numbers do not depend on what runs beside it; its time does.
# `scripts/gpu-convergence.sh --table-only` prints the table again from the files of an earlier run; `--plan`
# prints each combination the settings give and its floor runs, and runs nothing.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bin="${DPT_BUILD_DIR:-$root/build-gpu}/bin"
out="${OUT:-${DPT_BUILD_DIR:-$root/build-gpu}}/convergence"
manifest="$out/combinations.tsv"

# The table: reads the manifest (one line per combination: tag, workload, precision, GPUs, batches, steps,
# floor kind, status, note) and each run's JSON lines; writes the CSVs; exit status 1 when a bar is missed
# or a combination that should have run has no result.
table() {
  python3 - "$out" "$manifest" <<'PY'
import csv, json, math, os, sys

out, manifest = sys.argv[1], sys.argv[2]
SLACK = 1e-6  # the bar's absolute allowance: relative differences below it are float32 rounding of the loss


def json_lines(path):
    rows = []
    if os.path.exists(path):
        for line in open(path):
            try:
                rows.append(json.loads(line))
            except ValueError:
                pass
    return rows


def rel(a, b):
    """|a - b| / |b|; a non-finite loss on either side counts as infinitely far."""
    if not (math.isfinite(a) and math.isfinite(b)):
        return math.inf
    return abs(a - b) / abs(b) if b != 0 else (0.0 if a == 0 else math.inf)


def curves(tag, steps):
    """dptrain's and the reference's losses and each floor run's (system, losses), or why there are none."""
    ours = [r for r in json_lines(os.path.join(out, f"{tag}.dptrain.jsonl")) if "losses" in r]
    torch_rows = json_lines(os.path.join(out, f"{tag}.pytorch.jsonl"))
    ref = [r for r in torch_rows if r.get("role") == "reference" and "losses" in r]
    floors = [r for r in torch_rows if str(r.get("role", "")).startswith("floor") and "losses" in r]
    missing = [name for name, rows in (("dptrain", ours), ("PyTorch", ref), ("floor run", floors)) if not rows]
    if missing:
        return None, f"no losses from {', '.join(missing)}"

    def losses(row):  # dpt-bench writes a non-finite loss as null (JSON has no NaN); Python's json writes NaN
        return [math.nan if v is None else v for v in row["losses"]]

    d, p = losses(ours[-1]), losses(ref[-1])
    fl = [(r["system"], losses(r)) for r in floors]
    if not len(d) == len(p) == steps or any(len(f) != steps for _, f in fl):
        return None, (f"{len(d)}, {len(p)}, {'/'.join(str(len(f)) for _, f in fl)} losses (dptrain, PyTorch, "
                      f"floor runs) for {steps} steps")
    return (d, p, fl), None


def fmt(v):
    return "inf" if math.isinf(v) else f"{v:.2e}"


rows = list(csv.reader(open(manifest), delimiter="\t")) if os.path.exists(manifest) else []
def compact(kinds):
    """'cpu,units:1,units:2,units:3' -> 'cpu,units:1-3': three or more consecutive seeds of a kind as a range."""
    out, run = [], []

    def flush():
        out.extend([f"{run[0][0]}:{run[0][1]}-{run[-1][1]}"] if len(run) >= 3 else [f"{k}:{n}" for k, n in run])
        run.clear()

    for kind in kinds.split(","):
        name, _, seed = kind.partition(":")
        if not seed.isdigit():
            flush()
            out.append(kind)
        elif run and run[-1][0] == name and run[-1][1] + 1 == int(seed):
            run.append((name, int(seed)))
        else:
            flush()
            run.append((name, int(seed)))
    flush()
    return ",".join(out)


table, failures, notes = [], [], []
ok = True
all_csv = open(os.path.join(out, "convergence.csv"), "w", newline="")
all_writer = csv.writer(all_csv, lineterminator="\n")
header = ["step", "dptrain_loss", "pytorch_loss", "floor_loss", "gap", "floor", "gap_max", "floor_max", "bar"]
all_writer.writerow(["combination"] + header)
all_steps = set()
for tag, w, p, n, b, steps, floor_kind, status, note in rows:
    key = [w, p, n, b, compact(floor_kind)]
    steps = int(steps)
    all_steps.add(steps)
    if status == "interrupted":  # it should have run
        ok = False
        table.append(key + ["-", "-", "-", "-", "NO RESULT"])
        failures.append(f"{tag}: {note}")
        continue
    if status != "run":
        table.append(key + ["-", "-", "-", "-", status.upper()])
        notes.append(f"{tag}: {status}: {note}")
        continue
    got, why = curves(tag, steps)
    if got is None:
        ok = False
        table.append(key + ["-", "-", "-", "-", "NO RESULT"])
        failures.append(f"{tag}: {why} (logs: {out}/{tag}.*.log)")
        continue
    d, ref, floor_runs = got
    gap_max = floor_max = 0.0
    worst_ratio, worst_step, first_miss = -1.0, 0, None
    with open(os.path.join(out, f"{tag}.csv"), "w", newline="") as f:
        writer = csv.writer(f, lineterminator="\n")
        writer.writerow(header)
        for t in range(steps):
            # The floor at step t: the floor run farthest from the reference there.
            floor, floor_system, floor_loss = max((rel(f[t], ref[t]), system, f[t]) for system, f in floor_runs)
            gap = rel(d[t], ref[t])
            gap_max, floor_max = max(gap_max, gap), max(floor_max, floor)
            bar = 2 * floor_max + SLACK
            ratio = gap_max / (floor_max + SLACK / 2)
            if ratio > worst_ratio:
                worst_ratio, worst_step = ratio, t
            if gap_max > bar and first_miss is None:
                first_miss = (t, gap, floor, gap_max, floor_max, d[t], ref[t], floor_loss, floor_system)
            row = [t, d[t], ref[t], floor_loss, gap, floor, gap_max, floor_max, bar]
            writer.writerow(row)
            all_writer.writerow([tag] + row)
    passed = first_miss is None
    ok &= passed
    table.append(key + [fmt(floor_max), fmt(gap_max), str(worst_step),
                        "inf" if math.isinf(worst_ratio) else f"{worst_ratio:.2f}", "PASS" if passed else "FAIL"])
    if not passed:
        t, gap, floor, gm, fm, a, r, c, floor_system = first_miss
        failures.append(f"{tag}: first step over the bar {t}: gap {fmt(gap)} (max so far {fmt(gm)}) > 2 x floor "
                        f"{fmt(fm)} (max so far; this step {fmt(floor)}) + 1e-6; losses dptrain {a:.6f}, "
                        f"PyTorch {r:.6f}, {floor_system} {c:.6f} (curves: {out}/{tag}.csv)")
all_csv.close()

steps = "/".join(str(n) for n in sorted(all_steps)) or "no"
print(f"\n=== dptrain against PyTorch from the same start, {steps} steps: bar max gap <= 2 x max floor + 1e-6 "
      f"at every step ===")
for line in notes:
    print("  " + line)
if failures:
    print("failing combinations:")
    for line in failures:
        print("  " + line)
cols = ["workload", "precision", "GPUs", "batches", "floor run", "floor", "gap", "worst step", "ratio", "verdict"]
widths = [max(len(c), *(len(r[i]) for r in table)) if table else len(c) for i, c in enumerate(cols)]
print("  ".join(c.ljust(wd) for c, wd in zip(cols, widths)).rstrip())
for r in table:
    print("  ".join(v.ljust(wd) for v, wd in zip(r, widths)).rstrip())
count = {v: sum(1 for r in table if r[-1] == v) for v in ("PASS", "FAIL", "NO RESULT")}
print(f"=== convergence: {'PASS' if ok else 'FAIL'}: {count['PASS']} within the bar, {count['FAIL']} over it, "
      f"{count['NO RESULT']} without a result, {len(table) - sum(count.values())} skipped or excluded; floor and gap "
      f"are the largest relative loss differences over the steps; CSV: {out}/convergence.csv ===")
sys.exit(0 if ok else 1)
PY
}

plan=0
if [[ "${1:-}" == "--table-only" ]]; then
  [[ -f "$manifest" ]] || { echo "gpu-convergence: no earlier run in $out ($manifest is missing)" >&2; exit 2; }
  table
  exit $?
elif [[ "$#:${1:-}" == "1:--plan" ]]; then
  plan=1
elif (($#)); then
  echo "usage: scripts/gpu-convergence.sh [--table-only | --plan]  (settings: DPT_CONV_* variables, see the header)" >&2
  exit 2
fi

steps="${DPT_CONV_STEPS:-100}"
read -r -a workloads <<<"${DPT_CONV_WORKLOADS:-tiny_gpt mlp_92m gpt2_124m}"
read -r -a precisions <<<"${DPT_CONV_PRECISIONS:-fp32 bf16}"
read -r -a gpu_counts <<<"${DPT_CONV_GPUS:-1 2}"
read -r -a batch_modes <<<"${DPT_CONV_BATCHES:-repeat random}"
read -r -a exclude <<<"${DPT_CONV_EXCLUDE:-}"
deadline="${DPT_CONV_DEADLINE_S:-0}"
jobs="${DPT_CONV_JOBS:-1}"

usage_error() {
  echo "gpu-convergence: $1" >&2
  exit 2
}
[[ "$steps" =~ ^[1-9][0-9]*$ ]] || usage_error "DPT_CONV_STEPS must be a positive whole number, not '$steps'"
[[ "$deadline" =~ ^[0-9]+$ ]] || usage_error "DPT_CONV_DEADLINE_S must be a whole number of seconds, not '$deadline'"
[[ "$jobs" =~ ^[1-9][0-9]*$ ]] || usage_error "DPT_CONV_JOBS must be a positive whole number, not '$jobs'"
for w in "${workloads[@]}"; do
  [[ -f "$root/configs/bench_$w.yaml" ]] || usage_error "unknown workload '$w' in DPT_CONV_WORKLOADS (no configs/bench_$w.yaml)"
done
for p in "${precisions[@]}"; do
  [[ "$p" =~ ^(fp32|bf16)$ ]] || usage_error "unknown precision '$p' in DPT_CONV_PRECISIONS (fp32 bf16)"
done
for n in "${gpu_counts[@]}"; do
  [[ "$n" =~ ^[1-9][0-9]*$ ]] || usage_error "GPU count '$n' in DPT_CONV_GPUS is not a positive whole number"
done
for b in "${batch_modes[@]}"; do
  [[ "$b" =~ ^(repeat|random)$ ]] || usage_error "unknown batch mode '$b' in DPT_CONV_BATCHES (repeat random)"
done

# An MLP's default floor adds 16 unit permutations: whether some ReLU input within rounding of zero flips
# is a rare event, and only many draws show how far correct runs part when one does.
mlp_units="$(seq -s, -f 'units:%g' 1 16)"
# A GPT's bf16 rows with a repeated batch turn chaotic within their 100 steps (bf16 rounding parts correct
# runs faster than float32's), so they take 16 random orders where other rows take two.
gpt_orders="$(seq -s, -f 'order:%g' 1 16)"
floor_kind() {  # floor_kind WORKLOAD PRECISION BATCHES: what the floor runs change
  local units="" attention=",flash" orders="order:1,order:2"
  if [[ "$1" == mlp_* ]]; then
    units=",$mlp_units" attention=""
  elif [[ "$3" == repeat ]]; then
    orders="$gpt_orders"
  fi
  if [[ "$2" == bf16 ]]; then
    echo "${DPT_CONV_FLOOR_BF16:-compile,kernels$attention,order,$orders$units}"
  elif [[ "$1" == gpt2_124m ]]; then
    echo "${DPT_CONV_FLOOR_FP32_GPT2:-kernels,order,order:1,order:2}"
  else
    echo "${DPT_CONV_FLOOR_FP32:-cpu,order,order:1,order:2$units}"
  fi
}
# Checked once per workload and precision: a repeated batch's defaults hold every kind the random batch's
# do, and the DPT_CONV_FLOOR_* settings do not depend on the batch mode.
for p in "${precisions[@]}"; do
  for w in "${workloads[@]}"; do
    IFS=, read -r -a kinds <<<"$(floor_kind "$w" "$p" repeat)"
    for f in "${kinds[@]}"; do
      [[ "$f" =~ ^(cpu|compile|kernels|flash|order|order:[0-9]+|units:[0-9]+)$ ]] ||
        usage_error "unknown floor '$f' for $w $p (cpu compile kernels flash order order:N units:N)"
      [[ "$f" != units:* || "$w" == mlp_* ]] || usage_error "the units floor permutes an MLP's units, not $w's"
      [[ "$f" != flash || "$w" != mlp_* ]] || usage_error "the flash floor changes a GPT's attention; $w has none"
      [[ "$p:$f" != fp32:flash ]] || usage_error "the flash floor runs PyTorch's bf16 attention kernels, not fp32 ($w)"
      [[ "$p:$f" != bf16:cpu ]] || usage_error "the cpu floor compares float32 runs, not bf16 ones ($w)"
    done
  done
done

combinations=()
for n in "${gpu_counts[@]}"; do
  for b in "${batch_modes[@]}"; do
    for p in "${precisions[@]}"; do
      for w in "${workloads[@]}"; do combinations+=("$w:$p:$n:$b"); done
    done
  done
done
if ((plan)); then  # --plan: each combination and its floor runs, nothing run
  for c in "${combinations[@]}"; do
    IFS=: read -r w p n b <<<"$c"
    echo "${w}_${p}_${n}gpu_${b}: $(floor_kind "$w" "$p" "$b")"
  done
  exit 0
fi

[[ -x "$bin/dpt-bench" && -x "$bin/dpt-run" ]] || usage_error "$bin has no dpt-bench or dpt-run: build first (scripts/gpu-test.sh)"
python3 -c 'import torch' 2>/dev/null || usage_error "python3 cannot import torch: the PyTorch side cannot run"
visible="$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')"
((visible > 0)) || usage_error "no GPU visible to nvidia-smi -L"
# The GPUs as CUDA_VISIBLE_DEVICES names them, cut into one group per job (DPT_CONV_JOBS).
if [[ -n "${CUDA_VISIBLE_DEVICES:-}" ]]; then
  IFS=, read -r -a gpu_ids <<<"$CUDA_VISIBLE_DEVICES"
  ((${#gpu_ids[@]} < visible)) && visible=${#gpu_ids[@]}
else
  mapfile -t gpu_ids < <(seq 0 $((visible - 1)))
fi
((jobs <= visible)) || usage_error "DPT_CONV_JOBS=$jobs, but only $visible GPU(s) are visible"
group_size=$((visible / jobs))
groups=() cpu_sets=()  # job j's GPUs and, with several jobs, its share of the host's cores
cores="$(nproc)"
for ((j = 0; j < jobs; j++)); do
  groups+=("$(IFS=,; echo "${gpu_ids[*]:j*group_size:group_size}")")
  first_core=$((j * cores / jobs)) last_core=$(((j + 1) * cores / jobs - 1))
  cpu_sets+=("$first_core-$((last_core > first_core ? last_core : first_core))")
done
# NVLink multicast off, .deps on the library path, the same NCCL as PyTorch (scripts/gpu-env.sh).
source "$root/scripts/gpu-env.sh"
mkdir -p "$out"
rm -f "$out"/*.csv "$out"/*.jsonl "$out"/*.log  # an earlier run's curves are not this run's
: >"$manifest"
scratch="$(mktemp -d "${TMPDIR:-/tmp}/dpt-convergence.XXXXXX")"  # start files: up to ~1 GB each (MLP)
trap 'rm -rf "$scratch"' EXIT
interrupted=0
trap 'interrupted=1' INT TERM

# JSON lines of a run's output; under dpt-run rank 0's, whose lines start "[0]: ".
json_of() { sed -nE 's/^(\[0\]: )?(\{.*)$/\2/p' "$1"; }

run_combination() {  # run_combination TAG WORKLOAD PRECISION GPUS BATCHES FLOOR
  local tag="$1" w="$2" p="$3" n="$4" b="$5" floor="$6"
  local start="$scratch/$tag.safetensors" t0=$SECONDS
  rm -f "$out/$tag".*
  local dpt=("$bin/dpt-bench" train --workload "$w" --steps "$steps" --warmup 0 --precision "$p" --batches "$b"
    --save-start "$start" --losses)
  local ref=("$root/bench/pytorch_reference.py" --workload "$w" --steps "$steps" --warmup 0 --precision "$p"
    --batches "$b" --start-file "$start" --losses --floor "$floor" --bf16 pure)
  if ((n > 1)); then dpt=("$bin/dpt-run" --standalone --nproc-per-node "$n" -- "${dpt[@]}"); fi
  timeout 900 "${dpt[@]}" >"$out/$tag.dptrain.log" 2>&1
  local dpt_status=$?
  json_of "$out/$tag.dptrain.log" >"$out/$tag.dptrain.jsonl"
  local t1=$SECONDS
  if [[ ! -s "$start" ]]; then
    echo "$tag: dpt-bench exited with $dpt_status and wrote no start file; the end of $out/$tag.dptrain.log:"
    tail -n 5 "$out/$tag.dptrain.log" | sed 's/^/  /'
    return
  fi
  local launcher=(python3)
  if ((n > 1)); then launcher=(torchrun --standalone --nproc-per-node "$n"); fi
  PYTHONUNBUFFERED=1 timeout 1200 "${launcher[@]}" "${ref[@]}" >"$out/$tag.pytorch.log" 2>&1
  local ref_status=$?
  json_of "$out/$tag.pytorch.log" >"$out/$tag.pytorch.jsonl"
  rm -f "$start"
  echo "$tag: dptrain $((t1 - t0)) s (exit $dpt_status), PyTorch reference and $floor floor run $((SECONDS - t1)) s (exit $ref_status)"
  if ((ref_status != 0)); then tail -n 5 "$out/$tag.pytorch.log" | sed 's/^/  /'; fi
}

echo "gpu-convergence: ${#combinations[@]} combinations, $steps steps each, $visible GPU(s) visible," \
  "$jobs at once on GPUs ${groups[*]}; files in $out"
began=$SECONDS
declare -A group_of_job=()  # pid of a running combination -> the index of its group
mapfile -t free_groups < <(seq 0 $((jobs - 1)))
take_group() {  # sets group to a free group's index, waiting for a running combination to end if none is free
  while ((${#free_groups[@]} == 0)); do
    local pid
    wait -n -p pid "${!group_of_job[@]}"
    free_groups+=("${group_of_job[$pid]}")
    unset "group_of_job[$pid]"
  done
  group="${free_groups[0]}"
  free_groups=("${free_groups[@]:1}")
}
for c in "${combinations[@]}"; do
  IFS=: read -r w p n b <<<"$c"
  tag="${w}_${p}_${n}gpu_${b}"
  floor="$(floor_kind "$w" "$p" "$b")"
  status=run note=""
  for pattern in "${exclude[@]}"; do
    # shellcheck disable=SC2053  # the pattern is a glob on purpose
    if [[ "$c" == $pattern ]]; then status=excluded note="DPT_CONV_EXCLUDE has '$pattern'"; fi
  done
  if [[ "$status" == run ]] && ((n > group_size)); then
    status=skipped note="needs $n GPUs, $group_size for each of $jobs job(s) ($visible visible)"
  fi
  # Waiting for a free group takes time: the stop and the deadline are checked after it.
  [[ "$status" != run ]] || take_group
  if [[ "$status" != run ]]; then
    :
  elif ((interrupted)); then
    status=interrupted note="the run was stopped before this combination"
  elif ((deadline > 0 && SECONDS - began >= deadline)); then
    status=interrupted note="not started: $((SECONDS - began)) s had passed (DPT_CONV_DEADLINE_S=$deadline)"
  fi
  if [[ "$status" == run ]]; then
    (
      export CUDA_VISIBLE_DEVICES="${groups[group]}"
      if ((jobs > 1)) && command -v taskset >/dev/null; then taskset -cp "${cpu_sets[group]}" "$BASHPID" >/dev/null; fi
      run_combination "$tag" "$w" "$p" "$n" "$b" "$floor"
    ) &
    group_of_job[$!]="$group"
  else
    [[ -z "${group:-}" ]] || free_groups+=("$group")
    echo "$tag: $status: $note"
  fi
  group=""
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$tag" "$w" "$p" "$n" "$b" "$steps" "$floor" "$status" "$note" \
    >>"$manifest"
done
wait
echo "gpu-convergence: $((SECONDS - began)) s in all"
table
