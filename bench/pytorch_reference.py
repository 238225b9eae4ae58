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

Parameter names are dptrain's (wte.weight, blocks.0.attn.qkv.weight, ..., and 0.weight, 2.weight, ... for
the MLP), so `--start FILE` can take the initial weights and the batch from a safetensors file written by
`dpt-bench train --save-start FILE` ("__x", "__y" hold the batch), and `--losses` adds every step's loss:
scripts/gpu-convergence.sh compares the two loss curves from the same start.
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


# Module names follow dptrain's layers (layers/transformer_block.cpp, attention.cpp, gpt.cpp), so that
# named_parameters() gives the same names in the same order.
class CausalSelfAttention(nn.Module):
    def __init__(self, d, h):
        super().__init__()
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.h = h

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=2)
        q, k, v = (z.view(b, t, self.h, d // self.h).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, d))


class FeedForward(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.fc = nn.Linear(d, 4 * d)
        self.proj = nn.Linear(4 * d, d)

    def forward(self, x):
        return self.proj(F.gelu(self.fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, d, h):
        super().__init__()
        self.ln1 = nn.LayerNorm(d)
        self.attn = CausalSelfAttention(d, h)
        self.ln2 = nn.LayerNorm(d)
        self.mlp = FeedForward(d)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


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
                std = 0.02 / math.sqrt(2 * n_layer) if name.endswith(("attn.proj.weight", "mlp.proj.weight")) else 0.02
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


class MLP(nn.Sequential):
    """Linear, ReLU, ..., Linear in one Sequential, as dptrain's nn::MLP: parameters 0.weight, 0.bias,
    2.weight, ..., 12.bias."""

    def __init__(self, d_in, hidden, layers, classes, **_):
        dims = [d_in] + [hidden] * layers
        super().__init__(*[m for i in range(layers) for m in (nn.Linear(dims[i], dims[i + 1]), nn.ReLU())],
                         nn.Linear(hidden, classes))

    def forward(self, x, targets):
        return F.cross_entropy(super().forward(x).float(), targets)


SAFETENSORS_DTYPES = {"F32": (torch.float32, 4), "F16": (torch.float16, 2), "BF16": (torch.bfloat16, 2),
                      "F64": (torch.float64, 8), "I32": (torch.int32, 4), "I64": (torch.int64, 8)}


def load_safetensors(path):
    """Named CPU tensors and the metadata of a safetensors file (8-byte little-endian header length, JSON
    header, raw little-endian data), without the safetensors package."""
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 8:
        raise SystemExit(f"{path}: not a safetensors file (shorter than 8 bytes)")
    n = int.from_bytes(data[:8], "little")
    if 8 + n > len(data):
        raise SystemExit(f"{path}: header of {n} bytes runs past the end of the file")
    header = json.loads(data[8:8 + n])
    metadata = header.pop("__metadata__", None) or {}
    base = 8 + n
    tensors = {}
    for name, e in header.items():
        if e["dtype"] not in SAFETENSORS_DTYPES:
            raise SystemExit(f"{path}: tensor '{name}' has dtype {e['dtype']} "
                             f"(supported: {', '.join(SAFETENSORS_DTYPES)})")
        (dtype, size), (begin, end) = SAFETENSORS_DTYPES[e["dtype"]], e["data_offsets"]
        if not 0 <= begin <= end <= len(data) - base or end - begin != math.prod(e["shape"]) * size:
            raise SystemExit(f"{path}: tensor '{name}' has offsets {e['data_offsets']} that do not fit its shape "
                             f"{e['shape']} and dtype {e['dtype']} or the file")
        flat = (torch.frombuffer(bytearray(data[base + begin:base + end]), dtype=dtype) if end > begin
                else torch.empty(0, dtype=dtype))
        tensors[name] = flat.reshape(e["shape"])
    return tensors, metadata


def load_start(model, path, workload):
    """Copies every parameter from `path` (names must match both ways) and returns the batch (__x, __y)."""
    tensors, metadata = load_safetensors(path)
    if metadata.get("workload", workload) != workload:
        raise SystemExit(f"{path}: written for workload {metadata['workload']}, not {workload}")
    for k in ("__x", "__y"):
        if k not in tensors:
            raise SystemExit(f"{path}: no batch tensor '{k}' (write it with dpt-bench train --save-start)")
    batch = tensors.pop("__x"), tensors.pop("__y")
    params = dict(model.named_parameters())
    for name in params:
        if name not in tensors:
            raise SystemExit(f"{path}: model parameter '{name}' is not in the file")
    for name in tensors:
        if name not in params:
            raise SystemExit(f"{path}: tensor '{name}' is not a parameter of the model")
    with torch.no_grad():
        for name, p in params.items():
            if tuple(tensors[name].shape) != tuple(p.shape):
                raise SystemExit(f"{path}: parameter '{name}' has shape {list(tensors[name].shape)} in the file, "
                                 f"{list(p.shape)} in the model")
            p.copy_(tensors[name])
    return batch


def flops_per_step(cfg, n_params):
    """Matmul FLOPs of forward + backward (6 per parameter per token, plus attention for GPT)."""
    if cfg["kind"] == "gpt":
        tokens = cfg["batch"] * cfg["seq"]
        non_embedding = n_params - cfg["seq"] * cfg["d_model"]  # tied wte counts once, as the LM head
        attn = 12 * cfg["n_layer"] * cfg["seq"] * cfg["d_model"]  # QK^T and AV, fwd+bwd, per token
        return tokens * (6 * non_embedding + attn)
    return 6 * n_params * cfg["batch"]


def run(name, steps, warmup, precision, compile_model, peak_tflops, start_file=None, record_losses=False):
    cfg = WORKLOADS[name]
    torch.manual_seed(0)
    world, rank = dist.get_world_size() if dist.is_initialized() else 1, dist.get_rank() if dist.is_initialized() else 0
    dev = f"cuda:{torch.cuda.current_device()}"
    model = (GPT(**cfg) if cfg["kind"] == "gpt" else MLP(**cfg)).to(dev)
    start_batch = load_start(model, start_file, name) if start_file else None
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
        shape_x = shape_y = (cfg["batch"], cfg["seq"])
        x = torch.randint(0, cfg["vocab"], shape_x, device=dev)
        y = torch.randint(0, cfg["vocab"], shape_y, device=dev)
        units = cfg["batch"] * cfg["seq"]
    else:
        shape_x, shape_y = (cfg["batch"], cfg["d_in"]), (cfg["batch"],)
        x = torch.randn(*shape_x, device=dev)
        y = torch.randint(0, cfg["classes"], shape_y, device=dev)
        units = cfg["batch"]
    if start_batch is not None:  # dptrain's batch: token ids or float32 inputs, int64 targets
        sx, sy = start_batch
        if tuple(sx.shape) != shape_x or tuple(sy.shape) != shape_y:
            raise SystemExit(f"{start_file}: batch __x {list(sx.shape)}, __y {list(sy.shape)}; workload {name} needs "
                             f"{list(shape_x)}, {list(shape_y)}")
        x = sx.to(dev, torch.int64 if cfg["kind"] == "gpt" else torch.float32)
        y = sy.to(dev, torch.int64)
    autocast = torch.autocast("cuda", dtype=torch.bfloat16, enabled=precision == "bf16")
    torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"

    def step():
        with autocast:
            loss = step_model(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    losses = []  # --losses: every step's loss, read after its time is taken
    for _ in range(warmup):
        loss = step()
        if record_losses:
            losses.append(float(loss))
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
        if record_losses:
            losses.append(float(loss))
    times.sort()
    median = times[len(times) // 2]
    flops = flops_per_step(cfg, n_params)
    result = dict(system=("pytorch-compile" if compile_model else "pytorch-eager") + ("+ddp" if world > 1 else ""),
                  workload=name, precision=precision, world=world,
                  device=torch.cuda.get_device_name(), params=n_params, step_ms=median * 1e3,
                  throughput=units / median, unit="tokens/s" if cfg["kind"] == "gpt" else "samples/s",
                  mfu=flops / median / (peak_tflops * 1e12), peak_mem_gib=torch.cuda.max_memory_allocated() / 2**30,
                  final_loss=float(loss), timestamp=time.strftime("%Y-%m-%d"))
    if record_losses:
        result["losses"] = losses
    return result


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--workload", action="append", choices=sorted(WORKLOADS), help="default: all")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--precision", default="bf16", choices=["bf16", "fp32", "tf32"])
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--peak-tflops", type=float, default=989.0, help="bf16 dense peak for MFU (H100 SXM: 989)")
    ap.add_argument("--start", metavar="FILE",
                    help="initial parameters and batch from `dpt-bench train --save-start FILE` (one --workload)")
    ap.add_argument("--losses", action="store_true", help="add every step's loss, warm-up included, as \"losses\"")
    args = ap.parse_args()
    if args.start and len(args.workload or []) != 1:
        ap.error("--start needs exactly one --workload (the one the file was written for)")
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        dist.init_process_group("nccl")
    for name in args.workload or sorted(WORKLOADS):
        result = run(name, args.steps, args.warmup, args.precision, args.compile, args.peak_tflops, args.start,
                     args.losses)
        if not dist.is_initialized() or dist.get_rank() == 0:
            print(json.dumps(result), flush=True)
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
