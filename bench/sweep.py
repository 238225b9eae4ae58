#!/usr/bin/env python3
"""dpt-train against PyTorch over a grid of shapes the repository does not ship, on one GPU.

Each shape is a dpt-train config: a shipped benchmark config with the shape's keys overridden, resolved
by `dpt-train --print-config` into a file, so dptrain and the PyTorch reference (bench/pytorch_reference.py
--config) train exactly the same model. dptrain's step time is the median of the step times dpt-train
logs to metrics.jsonl (default settings, the first logged interval left out); PyTorch's is its median
step in each mode (eager, torch.compile and torch.compile with CUDA graphs unless --modes says otherwise),
every mode in a fresh process. The ratio is PyTorch's step over dptrain's, against the fastest PyTorch
mode. Prints one row per shape and the worst and median ratio per family last.

    python3 bench/sweep.py --out results/sweep            # the default grid
    python3 bench/sweep.py --gpt 4x512x512x8 --mlp 4x4096x1024 --modes eager,compile
    python3 bench/sweep.py --gpus 4                        # shapes spread over four GPUs, one at a time each

With --gpus N, N shapes run at once, each on a GPU of its own (CUDA_VISIBLE_DEVICES), dptrain and PyTorch
for a shape one after the other on the same GPU: a ratio never compares two GPUs.

GPT shapes are LAYERSxWIDTHxCONTEXTxBATCH (heads: width / 64); MLP shapes DEPTHxWIDTHxBATCH (input
1024, 1000 classes).
"""
import argparse
import json
import os
import queue
import statistics
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

from logged import logged_median

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Spread over the ranges users train (GPT: width 256-2048, layers 2-24, context 128-2048, batch 1-64;
# MLP: width 512-16384, depth 2-8, batch 64-4096), away from the three benchmark shapes.
GPT_GRID = ["2x256x128x64", "6x384x512x32", "8x512x1024x8", "12x1024x256x16", "24x1024x1024x4",
            "4x2048x2048x1", "16x1536x512x8"]
MLP_GRID = ["2x512x4096", "3x2048x1024", "4x8192x256", "8x1024x64", "2x16384x512"]


def overrides(family, shape):
    """The shape as dpt-train overrides of the family's benchmark config."""
    dims = [int(v) for v in shape.split("x")]
    if family == "gpt":
        layers, width, context, batch = dims
        return "tiny_gpt", [f"model.gpt.n_layer={layers}", f"model.gpt.n_embd={width}",
                            f"model.gpt.n_head={max(1, width // 64)}", f"model.gpt.block_size={context}",
                            f"data.seq_len={context}", f"training.batch_size={batch}"]
    depth, width, batch = dims
    return "mlp_92m", [f"model.mlp.hidden=[{','.join([str(width)] * depth)}]", f"training.batch_size={batch}"]


def run(cmd, log, env):
    with open(log, "w") as f:
        return subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, timeout=900, env=env).returncode


def dptrain_step_ms(train, config, run_dir, steps, log, env):
    """Median logged step time of a dpt-train run with default settings (first interval left out)."""
    rc = run([train, "--config", config, "--set", f"training.steps={steps}", "--set", "logging.every=5",
              "--set", f"checkpoint.dir={run_dir}", "--set", f"logging.metrics_file={run_dir}/metrics.jsonl",
              "--set", "checkpoint.resume=never", "--set", "eval.every=0",
              "--set", "eval.batches=1", "--set", "logging.progress_bar=false"], log, env)
    return logged_median(os.path.join(run_dir, "metrics.jsonl"), "step_ms") if rc == 0 else None


def pytorch_step_ms(config, mode, steps, log, env):
    args = [sys.executable, os.path.join(ROOT, "bench", "pytorch_reference.py"), "--config", config,
            "--steps", str(steps), "--warmup", "5"]
    if mode != "eager":
        args += ["--compile"] + ([] if mode == "compile" else ["--compile-mode", mode])
    if run(args, log, env) != 0:
        return None
    rows = [json.loads(l) for l in open(log) if l.startswith("{")]
    return rows[-1]["step_ms"] if rows else None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpt", action="append", help="GPT shapes (default: the built-in grid)")
    ap.add_argument("--mlp", action="append", help="MLP shapes (default: the built-in grid)")
    ap.add_argument("--modes", default="eager,compile,reduce-overhead",
                    help="PyTorch modes, comma-separated: eager, compile, reduce-overhead (CUDA graphs)")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--gpus", type=int, default=1, help="shapes measured at once, each on a GPU of its own")
    ap.add_argument("--out", default=os.path.join(ROOT, "build-gpu", "sweep"))
    ap.add_argument("--train", default=os.environ.get("DPT_TRAIN", os.path.join(ROOT, "build-gpu", "bin", "dpt-train")))
    args = ap.parse_args()
    if args.gpus < 1:
        ap.error("--gpus must be at least 1")
    os.makedirs(args.out, exist_ok=True)
    os.environ["DPT_TRAIN"] = args.train
    shapes = [("gpt", s) for s in (args.gpt or ([] if args.mlp else GPT_GRID))]
    shapes += [("mlp", s) for s in (args.mlp or ([] if args.gpt else MLP_GRID))]
    modes = [m for m in args.modes.split(",") if m]  # empty: dptrain only
    # The GPUs' names as CUDA_VISIBLE_DEVICES takes them: the first --gpus of those already visible.
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    gpu_ids = visible.split(",") if visible else [str(i) for i in range(args.gpus)]
    if len(gpu_ids) < args.gpus:
        ap.error(f"--gpus {args.gpus}, but CUDA_VISIBLE_DEVICES={visible} names {len(gpu_ids)}")
    free_gpus = queue.Queue()
    for gpu in gpu_ids[:args.gpus]:
        free_gpus.put(gpu)

    def measure(family, shape):
        """One shape on a free GPU: its row, printed when done, and (family, shape, ratio)."""
        base, sets = overrides(family, shape)
        name = f"{family}_{shape}"
        config = os.path.join(args.out, name + ".yaml")
        resolved = subprocess.run([args.train, "--config", os.path.join(ROOT, "configs", f"bench_{base}.yaml"),
                                   "--print-config"] + sum((["--set", s] for s in sets), []),
                                  capture_output=True, text=True)
        if resolved.returncode != 0:
            print(f"{family:<6} {shape:<16} config refused: {resolved.stderr.strip()}", flush=True)
            return family, shape, None
        with open(config, "w") as f:
            f.write(resolved.stdout)
        gpu = free_gpus.get()
        try:
            env = dict(os.environ)
            if args.gpus > 1:
                env["CUDA_VISIBLE_DEVICES"] = gpu
            ours = dptrain_step_ms(args.train, config, os.path.join(args.out, name), args.steps,
                                   os.path.join(args.out, name + ".dptrain.log"), env)
            theirs = {m: pytorch_step_ms(config, m, args.steps, os.path.join(args.out, f"{name}.{m}.log"), env)
                      for m in modes}
        finally:
            free_gpus.put(gpu)
        measured = [t for t in theirs.values() if t]
        ratio = min(measured) / ours if ours and measured else None
        cells = " ".join(f"{theirs[m]:>18.2f}" if theirs[m] else f"{'failed':>18}" for m in modes)
        print(f"{family:<6} {shape:<16} {ours if ours else float('nan'):>10.2f} {cells} "
              f"{ratio if ratio else float('nan'):>6.2f}x", flush=True)
        return family, shape, ratio

    print(f"{'family':<6} {'shape':<16} {'dptrain ms':>10} " + " ".join(f"{m + ' ms':>18}" for m in modes) +
          f" {'ratio':>7}", flush=True)
    with ThreadPoolExecutor(max_workers=args.gpus) as pool:
        results = list(pool.map(lambda s: measure(*s), shapes))
    print()
    for family in ("gpt", "mlp"):
        rows = [(s, r) for f, s, r in results if f == family and r]
        if rows:
            worst = min(rows, key=lambda x: x[1])
            print(f"{family}: worst {worst[1]:.2f}x ({worst[0]}), median {statistics.median(r for _, r in rows):.2f}x "
                  f"over {len(rows)} shapes (dptrain over the faster of PyTorch {', '.join(modes)})")
    failed = [f"{f} {s}" for f, s, r in results if not r]
    if failed:
        print("no ratio for: " + ", ".join(failed))


if __name__ == "__main__":
    main()
