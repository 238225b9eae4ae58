#!/usr/bin/env python3
"""PyTorch reference for `dpt-bench collectives`: times torch.distributed collectives on the same sizes,
the same way (warm-up, then CUDA events around each run on the current stream, median), and prints the
same table, so the two can be compared in one job:

    torchrun --nproc-per-node 2 apps/bench/pytorch_collectives.py --min-bytes 1K --max-bytes 1G
"""
import argparse
import os

import torch
import torch.distributed as dist


def parse_bytes(text):
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    if text[-1] in mult:
        return int(float(text[:-1]) * mult[text[-1]])
    return int(text)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--ops", default="allreduce")
    p.add_argument("--min-bytes", default="1K")
    p.add_argument("--max-bytes", default="1G")
    p.add_argument("--step-factor", type=int, default=2)
    p.add_argument("--dtype", default="f32", choices=["f32", "bf16"])
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--csv", help="also write the rows here (dpt-bench collectives' columns)")
    a = p.parse_args()
    local = int(os.environ.get("LOCAL_RANK", 0))
    torch.cuda.set_device(local)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    n, r = dist.get_world_size(), dist.get_rank()
    dtype = torch.float32 if a.dtype == "f32" else torch.bfloat16
    elem = torch.tensor([], dtype=dtype).element_size()
    csv = open(a.csv, "w") if a.csv and r == 0 else None
    if csv:
        csv.write("op,backend,dtype,ranks,bytes,count,time_us,algbw_GBps,busbw_GBps\n")
    if r == 0:
        print(f"# pytorch {torch.__version__} collectives: nccl, {n} ranks, {dtype}, median of {a.iters}")
        print(f"{'op':15} {'size(B)':>14} {'time(us)':>12} {'algbw(GB/s)':>11} {'busbw(GB/s)':>11}")
    for op in a.ops.split(","):
        size = parse_bytes(a.min_bytes)
        while size <= parse_bytes(a.max_bytes):
            count = size // elem
            if op in ("allgather", "reduce_scatter"):
                count = count // n * n
            # Same data as dpt-bench: tiny non-zero normals that repeated sums keep finite.
            full = (1e-36 * (1 + torch.arange(count, device="cuda") % 7)).to(dtype)
            part = (1e-36 * (1 + torch.arange(count // n, device="cuda") % 7)).to(dtype)

            def issue():
                if op == "allreduce":
                    dist.all_reduce(full)
                elif op == "broadcast":
                    dist.broadcast(full, 0)
                elif op == "allgather":
                    dist.all_gather_into_tensor(full, part)
                else:
                    dist.reduce_scatter_tensor(part, full)

            for _ in range(a.warmup):
                issue()
            events = [torch.cuda.Event(enable_timing=True) for _ in range(a.iters + 1)]
            events[0].record()
            for i in range(a.iters):
                issue()
                events[i + 1].record()
            torch.cuda.synchronize()
            times = sorted(1000 * events[i].elapsed_time(events[i + 1]) for i in range(a.iters))
            t = times[len(times) // 2]
            nbytes = count * elem
            algbw = nbytes / (t * 1e-6) / 1e9
            factor = {"allreduce": 2 * (n - 1) / n, "broadcast": 1.0}.get(op, (n - 1) / n)
            if r == 0:
                print(f"{op:15} {nbytes:14d} {t:12.2f} {algbw:11.2f} {algbw * factor:11.2f}", flush=True)
                if csv:
                    csv.write(f"{op},nccl,{a.dtype},{n},{nbytes},{count},{t},{algbw},{algbw * factor}\n")
            size *= a.step_factor
    if csv:
        csv.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
