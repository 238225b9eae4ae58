#!/usr/bin/env python3
"""PyTorch reference for dptrain's benchmark workloads (bench/README in the project README's
performance section). Builds the same model, batch and optimizer as `dpt-bench train`, runs a fixed
number of steps, and prints one JSON line per workload with tokens/s (or samples/s), median step time,
MFU and peak memory, so the project script can print ratios measured in the same run.

Under torchrun (WORLD_SIZE > 1) the model is wrapped in DistributedDataParallel (NCCL, default 25 MB
buckets, each rank its own batch of the same per-GPU size: weak scaling) and rank 0 prints the per-GPU
throughput with "world": N, which is what scripts/gpu-scaling.sh compares dptrain's DDP against.

Workloads (BENCHMARKS.md): gpt2_124m (12L, d768, 12H, T1024, V50304, B16), mlp_92m (1024 -> 6x4096
ReLU -> 1000, B512), tiny_gpt (4L, d256, 4H, T256, V4096, B32). AdamW (fused), bf16 autocast.
"""
import argparse
import json
import math
import time

import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

WORKLOADS = {
    "gpt2_124m": dict(kind="gpt", n_layer=12, d_model=768, n_head=12, seq=1024, vocab=50304, batch=16),
    "tiny_gpt": dict(kind="gpt", n_layer=4, d_model=256, n_head=4, seq=256, vocab=4096, batch=32),
    "mlp_92m": dict(kind="mlp", d_in=1024, hidden=4096, layers=6, classes=1000, batch=512),
}


class Block(nn.Module):
    def __init__(self, d, h):
        super().__init__()
        self.ln_1 = nn.LayerNorm(d)
        self.attn_qkv = nn.Linear(d, 3 * d)
        self.attn_proj = nn.Linear(d, d)
        self.ln_2 = nn.LayerNorm(d)
        self.fc = nn.Linear(d, 4 * d)
        self.proj = nn.Linear(4 * d, d)
        self.h = h

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.attn_qkv(self.ln_1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.h, d // self.h).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.attn_proj(y.transpose(1, 2).reshape(b, t, d))
        return x + self.proj(F.gelu(self.fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, n_layer, d_model, n_head, seq, vocab, **_):
        super().__init__()
        self.wte = nn.Embedding(vocab, d_model)
        self.wpe = nn.Embedding(seq, d_model)
        self.blocks = nn.ModuleList(Block(d_model, n_head) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(d_model)
        # GPT-2 initialisation, as dptrain's nn::GPT: N(0, 0.02), residual projections scaled by
        # 1/sqrt(2 n_layer), biases 0.
        for name, p in self.named_parameters():
            if p.dim() >= 2:
                std = 0.02 / math.sqrt(2 * n_layer) if name.endswith(("attn_proj.weight", ".proj.weight")) else 0.02
                nn.init.normal_(p, 0.0, std)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, idx, targets):
        t = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(t, device=idx.device))
        for b in self.blocks:
            x = b(x)
        logits = F.linear(self.ln_f(x), self.wte.weight)
        return F.cross_entropy(logits.view(-1, logits.size(-1)).float(), targets.view(-1))


class MLP(nn.Module):
    def __init__(self, d_in, hidden, layers, classes, **_):
        super().__init__()
        dims = [d_in] + [hidden] * layers
        self.body = nn.Sequential(*[m for i in range(layers) for m in (nn.Linear(dims[i], dims[i + 1]), nn.ReLU())])
        self.head = nn.Linear(hidden, classes)

    def forward(self, x, targets):
        return F.cross_entropy(self.head(self.body(x)).float(), targets)


def flops_per_step(cfg, n_params):
    """Matmul FLOPs of forward + backward (6 per parameter per token, plus attention for GPT)."""
    if cfg["kind"] == "gpt":
        tokens = cfg["batch"] * cfg["seq"]
        non_embedding = n_params - cfg["seq"] * cfg["d_model"]  # tied wte counts once, as the LM head
        attn = 12 * cfg["n_layer"] * cfg["seq"] * cfg["d_model"]  # QK^T and AV, fwd+bwd, per token
        return tokens * (6 * non_embedding + attn)
    return 6 * n_params * cfg["batch"]


def run(name, steps, warmup, precision, compile_model, peak_tflops):
    cfg = WORKLOADS[name]
    torch.manual_seed(0)
    world, rank = dist.get_world_size() if dist.is_initialized() else 1, dist.get_rank() if dist.is_initialized() else 0
    dev = f"cuda:{torch.cuda.current_device()}"
    model = (GPT(**cfg) if cfg["kind"] == "gpt" else MLP(**cfg)).to(dev)
    n_params = sum(p.numel() for p in model.parameters())
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=3e-4, betas=(0.9, 0.95), fused=True)
    step_model = torch.compile(model) if compile_model else model
    if world > 1:
        step_model = torch.nn.parallel.DistributedDataParallel(step_model, device_ids=[torch.cuda.current_device()])
    torch.manual_seed(1 + rank)  # each rank its own batch
    if cfg["kind"] == "gpt":
        x = torch.randint(0, cfg["vocab"], (cfg["batch"], cfg["seq"]), device=dev)
        y = torch.randint(0, cfg["vocab"], (cfg["batch"], cfg["seq"]), device=dev)
        units = cfg["batch"] * cfg["seq"]
    else:
        x = torch.randn(cfg["batch"], cfg["d_in"], device=dev)
        y = torch.randint(0, cfg["classes"], (cfg["batch"],), device=dev)
        units = cfg["batch"]
    autocast = torch.autocast("cuda", dtype=torch.bfloat16, enabled=precision == "bf16")
    torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"

    def step():
        with autocast:
            loss = step_model(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(steps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        loss = step()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    times.sort()
    median = times[len(times) // 2]
    flops = flops_per_step(cfg, n_params)
    return dict(system=("pytorch-compile" if compile_model else "pytorch-eager") + ("+ddp" if world > 1 else ""),
                workload=name, precision=precision, world=world,
                device=torch.cuda.get_device_name(), params=n_params, step_ms=median * 1e3,
                throughput=units / median, unit="tokens/s" if cfg["kind"] == "gpt" else "samples/s",
                mfu=flops / median / (peak_tflops * 1e12), peak_mem_gib=torch.cuda.max_memory_allocated() / 2**30,
                final_loss=float(loss), timestamp=time.strftime("%Y-%m-%d"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--workload", action="append", choices=sorted(WORKLOADS), help="default: all")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--precision", default="bf16", choices=["bf16", "fp32", "tf32"])
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--peak-tflops", type=float, default=989.0, help="bf16 dense peak for MFU (H100 SXM: 989)")
    args = ap.parse_args()
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        dist.init_process_group("nccl")
    for name in args.workload or sorted(WORKLOADS):
        result = run(name, args.steps, args.warmup, args.precision, args.compile, args.peak_tflops)
        if not dist.is_initialized() or dist.get_rank() == 0:
            print(json.dumps(result), flush=True)
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
