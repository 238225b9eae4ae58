#!/usr/bin/env python3
"""Checks that a GPT exported by dpt-export-hf computes in transformers what it computes in dptrain.

    scripts/check-hf-export.py runs/gpt2_124m data/tokens/val.bin [--out hf/gpt2_124m] [--device cuda]

1. Runs `dpt-export-hf RUN OUT --eval-tokens TOKENS --force`, which writes the Hugging Face folder and
   prints dptrain's loss on the first block_size tokens of the .bin token file ("loss <value>").
   With --dpt-loss VALUE the export is taken as done (OUT must hold it) and VALUE is dptrain's loss.
2. Loads OUT with transformers.GPT2LMHeadModel.from_pretrained in float32 (TF32 off, eager attention)
   and computes its loss on the same tokens: input_ids = labels = the first L = min(N, n_positions)
   tokens, which HF shifts, as dptrain scores predictions 1..L-1.
3. Exits 0 when the two agree within --rtol (relative, default 1e-4), 1 when they differ, 2 on a bad
   argument or file.
Needs torch and transformers (a GPU machine's environment); dpt-export-hf from the build tree.
"""
import argparse
import os
import re
import struct
import subprocess
import sys

TOKEN_MAGIC = 20240520
TOKEN_VERSION = 1
HEADER_INTS = 256


def read_tokens(path):
    """The uint16 tokens of a .bin token file (llm.c's layout), with its header checked."""
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < HEADER_INTS * 4:
        raise ValueError(f"{path}: {len(data)} bytes, shorter than the 1024-byte header")
    magic, version, count = struct.unpack_from("<3i", data, 0)
    if magic != TOKEN_MAGIC or version != TOKEN_VERSION:
        raise ValueError(f"{path}: not a version-{TOKEN_VERSION} token file (magic {magic}, version {version})")
    if len(data) != HEADER_INTS * 4 + 2 * count:
        raise ValueError(f"{path}: the header declares {count} tokens but the file has {len(data)} bytes")
    return list(struct.unpack_from(f"<{count}H", data, HEADER_INTS * 4))


def dptrain_loss(tool, run, out, tokens):
    """Exports `run` into `out` and returns the loss dpt-export-hf prints for `tokens`."""
    cmd = [tool, run, out, "--eval-tokens", tokens, "--force"]
    done = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=sys.stderr, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited with {done.returncode}")
    match = re.search(r"^loss (\S+)$", done.stdout, re.MULTILINE)
    if not match:
        raise RuntimeError(f"{' '.join(cmd)} printed no loss line: {done.stdout!r}")
    return float(match.group(1))


def transformers_loss(out, tokens, device):
    """The loss of the exported folder on the first n_positions tokens, in float32."""
    import torch
    from transformers import GPT2LMHeadModel

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    model = GPT2LMHeadModel.from_pretrained(out, torch_dtype=torch.float32, attn_implementation="eager")
    model.to(device).eval()
    length = min(len(tokens), model.config.n_positions)
    if length < 2:
        raise ValueError(f"need at least 2 tokens, the file has {len(tokens)}")
    ids = torch.tensor([tokens[:length]], dtype=torch.long, device=device)
    with torch.no_grad():
        return float(model(input_ids=ids, labels=ids).loss)


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    default_tool = os.path.join(here, "..", os.environ.get("DPT_BUILD_DIR", "build"), "bin", "dpt-export-hf")
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run", help="dpt-train run directory (or one step_N directory in it)")
    p.add_argument("tokens", help=".bin token file to score")
    p.add_argument("--out", help="folder of the export (default: <run>/hf)")
    p.add_argument("--tool", default=default_tool, help="dpt-export-hf to run (default: %(default)s)")
    p.add_argument("--dpt-loss", type=float, help="dptrain's loss, when OUT already holds the export")
    p.add_argument("--device", default="cpu", help="torch device for transformers (default: %(default)s)")
    p.add_argument("--rtol", type=float, default=1e-4, help="relative tolerance (default: %(default)s)")
    args = p.parse_args()
    out = args.out or os.path.join(args.run.rstrip("/"), "hf")
    try:
        tokens = read_tokens(args.tokens)
        ours = args.dpt_loss if args.dpt_loss is not None else dptrain_loss(args.tool, args.run, out, args.tokens)
    except (OSError, ValueError, RuntimeError) as e:
        print(f"check-hf-export: error: {e}", file=sys.stderr)
        return 2
    theirs = transformers_loss(out, tokens, args.device)
    difference = abs(ours - theirs)
    allowed = args.rtol * max(abs(ours), abs(theirs))
    verdict = "agree" if difference <= allowed else "DIFFER"
    print(f"dptrain loss {ours:.9g}, transformers loss {theirs:.9g}: |difference| {difference:.3g} "
          f"(allowed {allowed:.3g}) -> {verdict}")
    return 0 if difference <= allowed else 1


if __name__ == "__main__":
    sys.exit(main())
