#!/usr/bin/env python3
"""PyTorch reference for dptrain's benchmark workloads (bench/README in the project README's
performance section). Builds the same model, batch and optimizer as `dpt-bench train`, runs a fixed
number of steps, and prints one JSON line per workload with tokens/s (or samples/s), median step time,
MFU and peak memory, so the project script can print ratios measured in the same run.

Under torchrun (WORLD_SIZE > 1) the model is wrapped in DistributedDataParallel (NCCL, default 25 MB
buckets, each rank its own batch of the same per-GPU size: weak scaling) and rank 0 prints the per-GPU
throughput with "world": N, which is what scripts/gpu-scaling.sh compares dptrain's DDP against.

Workloads come from dptrain's own configs, the one definition of each: `--workload NAME` reads
configs/bench_NAME.yaml (gpt2_124m, mlp_92m, tiny_gpt; mlp_small runs in seconds on a CPU, for testing the
tools themselves) and `--config FILE` any dpt-train config with a GPT or an MLP, resolved by
`dpt-train --print-config` (so defaults are dptrain's): shape, bias, dropout, activation, batch size.
AdamW (fused), bf16 autocast. `--compile-mode` picks torch.compile's mode (reduce-overhead adds CUDA graphs).
`--bf16 pure` computes in bf16 the way dptrain does instead: the model's parameters and activations in
bf16 (softmax statistics, LayerNorm and the loss in float32 inside their kernels), float32 master weights
that AdamW updates from the bf16 gradients, rounded to the bf16 model after each step. Autocast keeps the
residual stream, LayerNorm's input and the embeddings in float32, which is other arithmetic.

--batches repeat (the default) trains every step on one batch; random draws a fresh batch for each step.

Parameter names are dptrain's (wte.weight, blocks.0.attn.qkv.weight, ..., and 0.weight, 2.weight, ... for
the MLP), so `--start-file FILE` can take the initial weights and the batches from a safetensors file written
by `dpt-bench train --save-start FILE` ("__x.RANK.I", "__y.RANK.I": rank RANK's batch for step I, warm-up
included), and `--losses` adds every step's loss: scripts/gpu-convergence.sh compares the loss curves
from the same start.

--floor KIND[,KIND...] trains once more from the same start after the reference run for each KIND and
prints a JSON line for each ("role": "floor-KIND"): PyTorch against itself, the distances
scripts/gpu-convergence.sh measures dptrain by. KIND is what differs, nothing else:
  cpu      the same run on the CPU (float32 only; every core, split between the ranks under torchrun,
           whose DDP then runs over Gloo)
  compile  torch.compile toggled (eager against compiled, or the reverse with --compile)
  order    every batch's examples in reverse order: the same sums of the same numbers in another order
           (the loss is a mean over the batch), so the distance is what reordering alone does;
           order:N permutes them at random instead, from seed N (several give PyTorch's spread where
           training is chaotic, as a repeated batch makes it after a few dozen steps)
  units:N  MLPs: the input features and every hidden layer's units permuted from seed N, the same function
           with every matmul summing in another order, the forward's included (which ReLU inputs round
           to which side of zero)
  kernels  other kernels on the GPU: deterministic algorithms, cuBLASLt for every matmul, and another
           attention backend (the math one in float32, memory-efficient attention in bf16)
  flash    bf16 GPTs: attention through PyTorch's FlashAttention kernels, the backend PyTorch takes where
           it does not prefer cuDNN's; at a GPT's first steps, where attention is near uniform, which backend
           PyTorch picks moves the loss more than any other kernel choice (where PyTorch's default already
           is flash, this run repeats the reference, and measures PyTorch's own run-to-run spread)
"""
import argparse
import contextlib
import copy
import gc
import json
import math
import os
import subprocess
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FLOORS = ("cpu", "compile", "kernels", "flash", "order")


# Module names follow dptrain's layers (layers/transformer_block.cpp, attention.cpp, gpt.cpp), so that
# named_parameters() gives the same names in the same order.
class CausalSelfAttention(nn.Module):
    def __init__(self, d, h, bias, dropout):
        super().__init__()
        self.qkv = nn.Linear(d, 3 * d, bias=bias)
        self.proj = nn.Linear(d, d, bias=bias)
        self.h = h
        self.dropout = dropout
        self.drop = nn.Dropout(dropout)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=2)
        q, k, v = (z.view(b, t, self.h, d // self.h).transpose(1, 2) for z in (q, k, v))
        p = self.dropout if self.training else 0.0
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=p)
        return self.drop(self.proj(y.transpose(1, 2).reshape(b, t, d)))


class FeedForward(nn.Module):
    def __init__(self, d, bias, dropout):
        super().__init__()
        self.fc = nn.Linear(d, 4 * d, bias=bias)
        self.proj = nn.Linear(4 * d, d, bias=bias)
        self.drop = nn.Dropout(dropout)

    def forward(self, x):
        return self.drop(self.proj(F.gelu(self.fc(x), approximate="tanh")))


class Block(nn.Module):
    def __init__(self, d, h, bias, dropout):
        super().__init__()
        self.ln1 = nn.LayerNorm(d, bias=bias)
        self.attn = CausalSelfAttention(d, h, bias, dropout)
        self.ln2 = nn.LayerNorm(d, bias=bias)
        self.mlp = FeedForward(d, bias, dropout)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, n_layer, d_model, n_head, seq, vocab, bias=True, dropout=0.0, **_):
        super().__init__()
        self.wte = nn.Embedding(vocab, d_model)
        self.wpe = nn.Embedding(seq, d_model)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(Block(d_model, n_head, bias, dropout) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(d_model, bias=bias)
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
        x = self.drop(self.wte(idx) + self.wpe(torch.arange(t, device=idx.device)))
        for b in self.blocks:
            x = b(x)
        logits = F.linear(self.ln_f(x), self.wte.weight)
        return F.cross_entropy(logits.view(-1, logits.size(-1)).float(), targets.view(-1))


ACTIVATIONS = {"relu": nn.ReLU, "gelu": lambda: nn.GELU(approximate="tanh"), "tanh": nn.Tanh}


class MLP(nn.Sequential):
    """Linear, activation, ..., Linear in one Sequential, as dptrain's nn::MLP: parameters 0.weight,
    0.bias, 2.weight, ..."""

    def __init__(self, d_in, hidden, classes, activation="relu", **_):
        dims = [d_in] + list(hidden)
        super().__init__(*[m for i in range(len(hidden)) for m in (nn.Linear(dims[i], dims[i + 1]),
                                                                   ACTIVATIONS[activation]())],
                         nn.Linear(dims[-1], classes))

    def forward(self, x, targets):
        return F.cross_entropy(super().forward(x).float(), targets)


def find_dpt_train():
    """The dpt-train that resolves configs: $DPT_TRAIN, else the first build folder that has one."""
    if os.environ.get("DPT_TRAIN"):
        return os.environ["DPT_TRAIN"]
    for build in ("build-gpu", "build", "build-cpu"):
        path = os.path.join(ROOT, build, "bin", "dpt-train")
        if os.path.exists(path):
            return path
    raise SystemExit("pytorch_reference.py: no dpt-train built (set DPT_TRAIN to resolve configs)")


def load_workload(path):
    """A dpt-train config as the shape this script builds: resolved by dpt-train itself (every default
    filled in), so the config file stays the one definition of a workload."""
    import yaml  # PyYAML
    # training.device=auto: where this script trains is its own --device, not the config's.
    out = subprocess.run([find_dpt_train(), "--config", path, "--print-config", "--set", "training.device=auto"],
                         capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"pytorch_reference.py: dpt-train could not resolve {path}:\n{out.stderr.strip()}")
    c = yaml.safe_load(out.stdout)
    model, data, training = c["model"], c["data"], c["training"]
    batch = training["batch_size"]
    if model["kind"] == "gpt":
        g = model["gpt"]
        vocab = g["vocab_size"] or data["vocab_size"]
        if not g["vocab_size"] and data["kind"] == "text":  # a character model: the corpus's characters
            with open(data["path"], encoding="utf-8") as f:
                vocab = len(set(f.read()))
        return dict(kind="gpt", n_layer=g["n_layer"], d_model=g["n_embd"], n_head=g["n_head"],
                    seq=g["block_size"] or data["seq_len"], vocab=vocab,
                    bias=g["bias"], dropout=g["dropout"], batch=batch)
    if model["kind"] == "mlp":
        return dict(kind="mlp", d_in=data["num_features"], hidden=model["mlp"]["hidden"],
                    classes=data["num_classes"], activation=model["mlp"]["activation"], batch=batch)
    raise SystemExit(f"pytorch_reference.py: {path}: model.kind {model['kind']} has no PyTorch twin here")


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


class Start:
    """The starting point `dpt-bench train --save-start` wrote: float32 parameters under dptrain's names,
    and each rank's batches (metadata "ranks" and "batches": how many of each)."""

    def __init__(self, path, workload):
        self.path = path
        tensors, metadata = load_safetensors(path)
        if metadata.get("workload", workload) != workload:
            raise SystemExit(f"{path}: written for workload {metadata['workload']}, not {workload}")
        try:
            self.ranks, self.count = int(metadata.get("ranks", "1")), int(metadata.get("batches", "1"))
        except ValueError:
            raise SystemExit(f"{path}: metadata ranks '{metadata.get('ranks')}' and batches "
                             f"'{metadata.get('batches')}' must be whole numbers")
        self.batches = {}
        for r in range(self.ranks):
            for i in range(self.count):
                names = (f"__x.{r}.{i}", f"__y.{r}.{i}")
                for k in names:
                    if k not in tensors:
                        raise SystemExit(f"{path}: no batch tensor '{k}' (the metadata says {self.ranks} ranks, "
                                         f"{self.count} batches each; write it with dpt-bench train --save-start)")
                self.batches[r, i] = tuple(tensors.pop(k) for k in names)
        for name in tensors:
            if name.startswith("__"):
                raise SystemExit(f"{path}: tensor '{name}' is no batch of the {self.ranks} ranks and {self.count} "
                                 f"batches the metadata names")
        self.params = tensors

    def load_into(self, model):
        """Copies every parameter from the file (names must match both ways)."""
        params = dict(model.named_parameters())
        for name in params:
            if name not in self.params:
                raise SystemExit(f"{self.path}: model parameter '{name}' is not in the file")
        for name in self.params:
            if name not in params:
                raise SystemExit(f"{self.path}: tensor '{name}' is not a parameter of the model")
        with torch.no_grad():
            for name, p in params.items():
                if tuple(self.params[name].shape) != tuple(p.shape):
                    raise SystemExit(f"{self.path}: parameter '{name}' has shape {list(self.params[name].shape)} in "
                                     f"the file, {list(p.shape)} in the model")
                p.copy_(self.params[name])

    def rank_batches(self, rank, world, needed):
        """Rank `rank`'s first `needed` batches, checked against the file's ranks and batches."""
        if self.ranks != world:
            raise SystemExit(f"{self.path}: holds the batches of {self.ranks} ranks; this run has {world}")
        if needed != self.count:
            raise SystemExit(f"{self.path}: holds {self.count} batches per rank; this run needs {needed} "
                             f"(--batches random: --warmup plus --steps, repeat: 1; as dpt-bench train was given)")
        return [self.batches[rank, i] for i in range(needed)]


def flops_per_step(cfg, n_params):
    """Matmul FLOPs of forward + backward (6 per parameter per token, plus attention for GPT)."""
    if cfg["kind"] == "gpt":
        tokens = cfg["batch"] * cfg["seq"]
        non_embedding = n_params - cfg["seq"] * cfg["d_model"]  # tied wte counts once, as the LM head
        attn = 12 * cfg["n_layer"] * cfg["seq"] * cfg["d_model"]  # QK^T and AV, fwd+bwd, per token
        return tokens * (6 * non_embedding + attn)
    return 6 * n_params * cfg["batch"]


@contextlib.contextmanager
def other_kernels(precision):
    """--floor kernels: the same arithmetic through other GPU kernels (deterministic algorithms, cuBLASLt
    for every matmul, another attention backend); restores PyTorch's defaults on the way out."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    torch.use_deterministic_algorithms(True, warn_only=True)  # cuBLAS needs CUBLAS_WORKSPACE_CONFIG: main()
    blas = torch.backends.cuda.preferred_blas_library()
    torch.backends.cuda.preferred_blas_library("cublaslt")
    backend = SDPBackend.EFFICIENT_ATTENTION if precision == "bf16" else SDPBackend.MATH
    try:
        with sdpa_kernel(backend):
            yield
    finally:
        torch.backends.cuda.preferred_blas_library(blas)
        torch.use_deterministic_algorithms(False)


@contextlib.contextmanager
def flash_attention():
    """--floor flash: every attention through PyTorch's FlashAttention backend."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        yield


def make_adamw(model, device):
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}]
    try:
        return torch.optim.AdamW(groups, lr=3e-4, betas=(0.9, 0.95), fused=True)
    except (RuntimeError, TypeError):
        if device.type == "cuda":
            raise
        return torch.optim.AdamW(groups, lr=3e-4, betas=(0.9, 0.95))  # a PyTorch without the fused CPU AdamW


def draw_batches(cfg, count, seed, device):
    """`count` random batches from `seed`, drawn on the CPU (the same numbers whatever `device` is)."""
    gen = torch.Generator().manual_seed(seed)
    batches = []
    for _ in range(count):
        if cfg["kind"] == "gpt":
            shape = (cfg["batch"], cfg["seq"])
            x = torch.randint(0, cfg["vocab"], shape, generator=gen)
            y = torch.randint(0, cfg["vocab"], shape, generator=gen)
        else:
            x = torch.randn(cfg["batch"], cfg["d_in"], generator=gen)
            y = torch.randint(0, cfg["classes"], (cfg["batch"],), generator=gen)
        batches.append((x.to(device), y.to(device)))
    return batches


def permute_units(model, seed):
    """Permutes an MLP's input features and every hidden layer's units from `seed`: the same function, but
    every matmul sums in another order. Returns the input features' permutation (for the batches)."""
    gen = torch.Generator().manual_seed(seed)
    linears = [m for m in model if isinstance(m, nn.Linear)]
    first = previous = torch.randperm(linears[0].in_features, generator=gen)
    with torch.no_grad():
        for i, layer in enumerate(linears):
            out = (torch.randperm(layer.out_features, generator=gen) if i + 1 < len(linears)
                   else torch.arange(layer.out_features))  # the classes keep their order: the same loss
            layer.weight.copy_(layer.weight[out][:, previous])
            layer.bias.copy_(layer.bias[out])
            previous = out
    return first


def run(name, cfg, args, device, compile_model, kernels=False, flash=False, order=None, unit_seed=None,
        start=None, group=None, role=None):
    """One training run of `args.steps` timed steps after `args.warmup`; its JSON result."""
    torch.manual_seed(0)
    world, rank = (dist.get_world_size(), dist.get_rank()) if dist.is_initialized() else (1, 0)
    model = (GPT(**cfg) if cfg["kind"] == "gpt" else MLP(**cfg))  # initialised on the CPU: the same on any device
    if start is not None:
        start.load_into(model)
    features = permute_units(model, unit_seed) if unit_seed is not None else None
    model = model.to(device)
    n_params = sum(p.numel() for p in model.parameters())
    opt = make_adamw(model, device)
    pure = args.precision == "bf16" and args.bf16 == "pure"
    # --bf16 pure: `model` holds the float32 masters the optimizer updates, `compute` their bf16 copies.
    compute = copy.deepcopy(model).to(torch.bfloat16) if pure else model
    masters, twins = list(model.parameters()), list(compute.parameters())
    step_model = torch.compile(compute, mode=args.compile_mode) if compile_model else compute
    if world > 1:
        step_model = torch.nn.parallel.DistributedDataParallel(
            step_model, device_ids=[device.index] if device.type == "cuda" else None, process_group=group)
    n_batches = args.warmup + args.steps if args.batches == "random" else 1
    if start is not None:  # dptrain's batches: token ids or float32 inputs, int64 targets
        batches = [(x.to(device, torch.int64 if cfg["kind"] == "gpt" else torch.float32), y.to(device, torch.int64))
                   for x, y in start.rank_batches(rank, world, n_batches)]
    else:
        batches = draw_batches(cfg, n_batches, 1 + rank, device)  # each rank its own
    if order is not None:  # "reverse", or the seed of a random permutation (drawn on the CPU)
        n = batches[0][0].shape[0]
        perm = (torch.arange(n - 1, -1, -1) if order == "reverse" else
                torch.randperm(n, generator=torch.Generator().manual_seed(order))).to(batches[0][0].device)
        batches = [(x[perm], y[perm]) for x, y in batches]
    if features is not None:
        batches = [(x[:, features.to(x.device)], y) for x, y in batches]
    if pure:  # the MLP's float inputs enter the bf16 model in bf16, as in dptrain
        batches = [(x.to(torch.bfloat16) if x.is_floating_point() else x, y) for x, y in batches]
    x0, y0 = batches[0]
    shape_x = (cfg["batch"], cfg["seq"]) if cfg["kind"] == "gpt" else (cfg["batch"], cfg["d_in"])
    shape_y = shape_x if cfg["kind"] == "gpt" else (cfg["batch"],)
    if tuple(x0.shape) != shape_x or tuple(y0.shape) != shape_y:
        raise SystemExit(f"{args.start}: batch x {list(x0.shape)}, y {list(y0.shape)}; workload {name} needs "
                         f"{list(shape_x)}, {list(shape_y)}")
    units = cfg["batch"] * cfg["seq"] if cfg["kind"] == "gpt" else cfg["batch"]
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.precision == "bf16" and not pure)
    cuda = device.type == "cuda"
    # The older of PyTorch's two TF32 switches: torch.compile (2.9 to 2.11 at least) reads it, and fails once
    # the newer one (matmul.fp32_precision) has been set. No convolutions here, so cuDNN's switch is moot.
    torch.backends.cuda.matmul.allow_tf32 = args.precision == "tf32"

    def step(i):
        x, y = batches[i % len(batches)]
        with autocast:
            loss = step_model(x, y)
        loss.backward()
        if pure:
            for m, t in zip(masters, twins):
                m.grad, t.grad = t.grad.float(), None
        opt.step()
        opt.zero_grad(set_to_none=True)
        if pure:
            with torch.no_grad():
                torch._foreach_copy_(twins, masters)  # round to nearest even, as dptrain's twins
        return loss

    losses = []  # --losses: every step's loss, read after its time is taken
    with other_kernels(args.precision) if kernels else flash_attention() if flash else contextlib.nullcontext():
        for i in range(args.warmup):
            loss = step(i)
            if args.losses:
                losses.append(float(loss))
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        times = []
        for i in range(args.warmup, args.warmup + args.steps):
            if cuda:
                begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                begin.record()
                loss = step(i)
                end.record()
                end.synchronize()
                times.append(begin.elapsed_time(end) / 1e3)
            else:
                t0 = time.perf_counter()
                loss = step(i)
                times.append(time.perf_counter() - t0)
            if args.losses:
                losses.append(float(loss))
    times.sort()
    median = times[len(times) // 2]
    flops = flops_per_step(cfg, n_params)
    compiled = "pytorch-compile" + ("" if args.compile_mode == "default" else "-" + args.compile_mode)
    system = (compiled if compile_model else "pytorch-eager") + ("-bf16-pure" if pure else "") + \
        ("-kernels" if kernels else "") + ("-flash" if flash else "") + \
        ("" if order is None else "-reversed" if order == "reverse" else f"-permuted{order}") + \
        ("" if unit_seed is None else f"-units{unit_seed}") + ("-cpu" if not cuda else "") + \
        ("+ddp" if world > 1 else "")
    result = dict(system=system, workload=name, precision=args.precision, world=world, batches=args.batches,
                  device=torch.cuda.get_device_name(device) if cuda else f"cpu ({torch.get_num_threads()} threads)",
                  params=n_params, step_ms=median * 1e3,
                  throughput=units / median, unit="tokens/s" if cfg["kind"] == "gpt" else "samples/s",
                  mfu=flops / median / (args.peak_tflops * 1e12) if cuda else 0.0,
                  peak_mem_gib=torch.cuda.max_memory_allocated(device) / 2**30 if cuda else 0.0,
                  final_loss=float(loss), timestamp=time.strftime("%Y-%m-%d"))
    if role:
        result["role"] = role
    if args.losses:
        result["losses"] = losses
    return result


def parse_floor(kind):
    """A floor kind as (what, seed): (cpu | compile | kernels | flash | order, None), (order, N) or
    (units, N)."""
    head, colon, seed = kind.partition(":")
    if not colon and head in FLOORS:
        return head, None
    if colon and head in ("order", "units") and seed.isdigit():
        return head, int(seed)
    raise argparse.ArgumentTypeError(f"unknown floor '{kind}' (choose from {', '.join(FLOORS)}, order:N, units:N)")


def floor_kinds(text):
    """--floor's comma-separated kinds, each once."""
    kinds = text.split(",")
    for k in kinds:
        parse_floor(k)
    if len(set(kinds)) != len(kinds):
        raise argparse.ArgumentTypeError(f"'{text}' names a floor twice")
    return kinds


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--workload", action="append",
                    help="configs/bench_NAME.yaml (default: gpt2_124m, mlp_92m, tiny_gpt)")
    ap.add_argument("--config", action="append", default=[], help="any dpt-train config of a GPT or an MLP")
    ap.add_argument("--compile-mode", default="default", choices=["default", "reduce-overhead", "max-autotune"],
                    help="torch.compile's mode with --compile (reduce-overhead: CUDA graphs)")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--precision", default="bf16", choices=["bf16", "fp32", "tf32"])
    ap.add_argument("--bf16", default="autocast", choices=["autocast", "pure"],
                    help="how --precision bf16 computes: torch.autocast, or dptrain's scheme (see the top)")
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"], help="where the reference run trains")
    ap.add_argument("--batches", default="repeat", choices=["repeat", "random"],
                    help="one batch for every step, or a fresh one each step (warm-up included)")
    ap.add_argument("--peak-tflops", type=float, default=989.0, help="bf16 dense peak for MFU (H100 SXM: 989)")
    # Not "--start": torchrun reads its script's arguments too and takes that as its own --start-method.
    ap.add_argument("--start-file", dest="start", metavar="FILE",
                    help="initial parameters and batches from `dpt-bench train --save-start FILE` (one --workload)")
    ap.add_argument("--losses", action="store_true", help="add every step's loss, warm-up included, as \"losses\"")
    ap.add_argument("--floor", type=floor_kinds, default=[],
                    help="after the reference run, the same run once more for each comma-separated KIND with only that "
                         "changed (see the top)")
    args = ap.parse_args()
    if args.start and len(args.workload or []) + len(args.config) != 1:
        ap.error("--start-file needs exactly one --workload or --config (the one the file was written for)")
    if args.steps <= 0 or args.warmup < 0:
        ap.error("--steps must be > 0 and --warmup >= 0")
    if "cpu" in args.floor and args.precision == "bf16":
        ap.error("--floor cpu compares float32 runs (bf16 autocast on a CPU is other arithmetic): use compile "
                 "or kernels")
    if "kernels" in args.floor and args.device != "cuda":
        ap.error("--floor kernels chooses other GPU kernels: it needs --device cuda")
    if "flash" in args.floor and (args.device != "cuda" or args.precision != "bf16"):
        ap.error("--floor flash takes PyTorch's FlashAttention kernels, which run bf16 on a GPU: it needs "
                 "--precision bf16 and --device cuda")
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("pytorch_reference.py: no GPU visible to PyTorch (--device cpu to train on the CPU)")
    if "kernels" in args.floor:
        # Deterministic cuBLAS needs a fixed workspace, read when cuBLAS first starts: before any GPU work.
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    torch.set_num_threads(max(1, cores // world))  # a CPU run gets every core, split between the ranks
    group = cpu_group = None
    if world > 1:
        if args.device == "cuda":
            torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        dist.init_process_group("nccl" if args.device == "cuda" else "gloo")
        if "cpu" in args.floor and args.device == "cuda":
            cpu_group = dist.new_group(backend="gloo")  # DDP of the CPU run
    device = torch.device(f"cuda:{torch.cuda.current_device()}" if args.device == "cuda" else "cpu")
    names = args.workload or ([] if args.config else ["gpt2_124m", "mlp_92m", "tiny_gpt"])
    paths = [(n, os.path.join(ROOT, "configs", f"bench_{n}.yaml")) for n in names]
    paths += [(os.path.splitext(os.path.basename(c))[0], c) for c in args.config]
    workloads = [(name, load_workload(path)) for name, path in paths]
    if any(parse_floor(k)[0] == "units" for k in args.floor):
        for name, cfg in workloads:
            if cfg["kind"] != "mlp":
                ap.error(f"--floor units:N permutes an MLP's units; workload {name} is a {cfg['kind']}")
    if "flash" in args.floor:
        for name, cfg in workloads:
            if cfg["kind"] != "gpt":
                ap.error(f"--floor flash changes a GPT's attention; workload {name} is a {cfg['kind']}")
    start = Start(args.start, workloads[0][0]) if args.start else None
    for name, cfg in workloads:
        runs = [dict(device=device, compile_model=args.compile, group=group)]
        for kind in args.floor:
            what, seed = parse_floor(kind)
            changed = {"cpu": dict(device=torch.device("cpu"), group=cpu_group),
                       "compile": dict(compile_model=not args.compile),
                       "kernels": dict(kernels=True),
                       "flash": dict(flash=True),
                       "order": dict(order="reverse" if seed is None else seed),
                       "units": dict(unit_seed=seed)}[what]
            runs.append({**runs[0], **changed, "role": f"floor-{kind}"})
        if args.floor:
            runs[0]["role"] = "reference"
        for r in runs:
            result = run(name, cfg, args, start=start, **r)
            if not dist.is_initialized() or dist.get_rank() == 0:
                print(json.dumps(result), flush=True)
            gc.collect()  # the next run's model and optimizer in the memory this one held
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
