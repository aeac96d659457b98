"""``cli.py bench prefill``: prefill latency and peak memory of a patched Hugging Face model per mode.

    python cli.py bench prefill                 # tiny random Qwen3 on the CPU, n = 1k .. 8k, w = 256
    python cli.py bench prefill --model Qwen/Qwen3-8B --device cuda --dtype bfloat16 --lengths 4096 16384 32768
    python cli.py bench prefill --model smollm2 --lengths 1024 4096   # after `python cli.py fetch smollm2`

Modes run interleaved within each repeat, so their ratios share the machine's state. Memory is the peak
tensor memory of one forward (the CUDA allocator's peak, or the CPU profiler's timeline).
"""
from __future__ import annotations

import argparse
import statistics
import time
from datetime import date
from pathlib import Path

import torch

from .machine import describe, positive_int, sync
from .memory import peak_bytes
from ..utils.atomic import write_text

MODES = ("full", "swa", "sa", "sa_swa", "moba")


def tiny_model():
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=4096, hidden_size=128, intermediate_size=341, num_hidden_layers=4,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=65536)
    return Qwen3ForCausalLM(cfg).eval()


def run(args) -> list[dict]:
    from ..inference.patcher import PatchSpec, patch, unpatch
    from ..models.sources import load_causal_lm, resolve

    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype)
    model = tiny_model() if args.model == "tiny" else load_causal_lm(resolve(args.model), dtype)
    model.to(device=device, dtype=dtype)
    specs = {"full": PatchSpec("full"), "swa": PatchSpec("swa", args.window), "sa": PatchSpec("sa", args.window),
             "sa_swa": PatchSpec("sa_swa", args.window),
             "moba": PatchSpec("moba", block_size=args.window // 2, top_k=2)}
    rows = []
    for n in args.lengths:
        ids = torch.randint(0, model.config.vocab_size, (args.batch, n), device=device)

        def forward():
            with torch.no_grad():
                model(ids, use_cache=False, logits_to_keep=1)
            sync(device)

        times = {m: [] for m in args.modes}
        for _ in range(args.repeats):
            for mode in args.modes:
                patch(model, specs[mode])
                forward()  # warm-up
                start = time.perf_counter()
                forward()
                times[mode].append(time.perf_counter() - start)
        for mode in args.modes:
            patch(model, specs[mode])
            row = {"n": n, "mode": mode, "ms": statistics.median(times[mode]) * 1e3,
                   "peak_mib": peak_bytes(forward, device) / 2**20}
            rows.append(row)
        swa = next(r for r in rows if r["n"] == n and r["mode"] == "swa")
        for r in rows:
            if r["n"] == n:
                r["x_swa"] = r["ms"] / swa["ms"]
        print(" ".join(f"{r['mode']} {r['ms']:.0f}ms ({r['x_swa']:.2f}x swa, {r['peak_mib']:.0f} MiB)"
                       for r in rows if r["n"] == n), f"  n={n}", flush=True)
        unpatch(model)
    return rows


def markdown(rows: list[dict], args) -> str:
    lines = [f"# bench prefill ({date.today()}, {describe(torch.device(args.device))}, model {args.model}, "
             f"batch {args.batch}, w={args.window}, {args.dtype})", "",
             "| n | mode | ms | × SWA | peak MiB |", "|---:|---|---:|---:|---:|"]
    lines += [f"| {r['n']} | {r['mode']} | {r['ms']:.1f} | {r['x_swa']:.2f} | {r['peak_mib']:.1f} |" for r in rows]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser(prog="cli.py bench prefill", description=__doc__.splitlines()[0])
    p.add_argument("--model", default="tiny", help="tiny (a random 4-layer Qwen3), a Hub id, a local folder, a .gguf "
                   "file or smollm2 (fetched)")
    p.add_argument("--lengths", type=positive_int, nargs="+", default=[1024, 2048, 4096, 8192])
    p.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    p.add_argument("--window", type=positive_int, default=256)
    p.add_argument("--batch", type=positive_int, default=1)
    p.add_argument("--repeats", type=positive_int, default=3)
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"))
    p.add_argument("--out", default="outputs/bench")
    args = p.parse_args(argv)
    if "swa" not in args.modes:
        args.modes.insert(0, "swa")  # the ratios' reference
    rows = run(args)
    text = markdown(rows, args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    write_text(out / "prefill.md", text)
    print(text)
    return rows
