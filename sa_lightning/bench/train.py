"""``cli.py bench train``: training step time and tokens/s of every variant, and the data pipeline's speed.

The model is the tiny config's Transformer++ (or ``--preset paper``: the 360M model at seq 2048 on a
GPU). Variants step interleaved within each repeat, so their ratios share the machine's state. The
data pipeline (tokenize + pack the embedded corpus, then read blocks) is timed in the same run, so
its tokens/s can be compared with what training consumes.
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from datetime import date
from pathlib import Path

import torch
import torch.nn.functional as F

from ..models import ModelConfig, Transformer
from .machine import describe, positive_int, sync
from ..utils.atomic import write_text

VARIANTS = ("full", "swa", "sa", "sa_swa", "moba")
PRESETS = {
    "cpu": dict(model="tiny", seq_len=256, batch=16, window=32, moba_block_size=16, steps=4, repeats=3,
                device="cpu", dtype="float32"),
    "paper": dict(model="360m", seq_len=2048, batch=16, window=256, moba_block_size=128, steps=5, repeats=3,
                  device="cuda", dtype="bfloat16"),
}



class StepCase:
    """One variant: a model, an optimizer and a fixed batch; each call is one full training step."""

    def __init__(self, variant: str, args, device: torch.device):
        cfg = ModelConfig.from_name(args.model, variant=variant, window=args.window, max_seq_len=args.seq_len,
                                    moba_block_size=args.moba_block_size)
        torch.manual_seed(0)
        self.model = Transformer(cfg).to(device)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-4, fused=device.type == "cuda")
        self.batch = torch.randint(0, cfg.vocab_size, (args.batch, args.seq_len + 1), device=device)
        self.device, self.dtype, self.step_index = device, getattr(torch, args.dtype), 0

    def step(self) -> None:
        with torch.autocast(self.device.type, dtype=self.dtype, enabled=self.dtype != torch.float32):
            logits = self.model(self.batch[:, :-1], perm_stream=self.step_index)
        loss = F.cross_entropy(logits.float().flatten(0, 1), self.batch[:, 1:].flatten())
        loss.backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        self.step_index += 1

    def timed(self, steps: int) -> float:
        sync(self.device)
        t0 = time.perf_counter()
        for _ in range(steps):
            self.step()
        sync(self.device)
        return (time.perf_counter() - t0) / steps


def data_pipeline_tokens_per_second(seq_len: int, batch: int) -> tuple[float, float]:
    """(tokenize+pack, read packed blocks) tokens/s on the embedded corpus, from a cold cache."""
    from torch.utils.data import DataLoader

    from ..data import BlockSampler, PackedBlocks, SourceConfig, load_tokenizer, prepare_tokens

    tok = load_tokenizer("embedded")
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        folder = prepare_tokens(SourceConfig("embedded", split="train"), tok, "embedded", tmp, progress=False)
        pack = PackedBlocks(folder, seq_len).meta["num_tokens"] / (time.perf_counter() - t0)
        blocks = PackedBlocks(folder, seq_len)
        t0 = time.perf_counter()
        n = sum(b[:, 1:].numel() for b in DataLoader(blocks, batch_size=batch, sampler=BlockSampler(len(blocks))))
        read = n / (time.perf_counter() - t0)
    return pack, read


def run(args) -> tuple[list[dict], dict]:
    device = torch.device(args.device)
    cases = {v: StepCase(v, args, device) for v in args.variants}
    for case in cases.values():  # warm-up: allocator, kernels, compiled paths
        case.timed(1)
    times: dict[str, list[float]] = {v: [] for v in cases}
    for r in range(args.repeats):
        for v, case in cases.items():
            times[v].append(case.timed(args.steps))
        print(f"repeat {r + 1}/{args.repeats}: " + ", ".join(f"{v} {times[v][-1] * 1e3:.0f} ms" for v in cases), flush=True)
    tokens = args.batch * args.seq_len
    rows = []
    for v in cases:
        sec = statistics.median(times[v])
        rows.append({"variant": v, "step_ms": sec * 1e3, "tokens_per_s": tokens / sec,
                     "params_M": cases[v].model.num_parameters() / 1e6})
    base = {r["variant"]: r["step_ms"] for r in rows}
    for r in rows:
        r["vs_swa"] = r["step_ms"] / base["swa"] if "swa" in base else float("nan")
    pack, read = data_pipeline_tokens_per_second(args.seq_len, args.batch) if args.data else (float("nan"),) * 2
    slowest = min(r["tokens_per_s"] for r in rows)
    fastest = max(r["tokens_per_s"] for r in rows)
    data = {"pack_tokens_per_s": pack, "read_tokens_per_s": read, "pack_vs_fastest_training": pack / fastest,
            "pack_vs_slowest_training": pack / slowest}
    return rows, data


def markdown(rows, data, args) -> str:
    head = (f"Training step, {args.preset} preset: model {args.model}, B={args.batch}, seq {args.seq_len}, "
            f"w={args.window}, {args.dtype}, {describe(args.device)}, "
            f"{date.today()}; median of {args.repeats} interleaved repeats of {args.steps} steps.\n\n")
    lines = ["| variant | params (M) | step (ms) | tokens/s | × SWA |", "|---|---:|---:|---:|---:|"]
    lines += [f"| {r['variant']} | {r['params_M']:.2f} | {r['step_ms']:.0f} | {r['tokens_per_s']:,.0f} | {r['vs_swa']:.2f} |"
              for r in rows]
    tail = ""
    if data["pack_tokens_per_s"] == data["pack_tokens_per_s"]:
        tail = (f"\n\nData pipeline (embedded corpus, cold cache): tokenize+pack {data['pack_tokens_per_s']:,.0f} tokens/s, "
                f"read packed blocks {data['read_tokens_per_s']:,.0f} tokens/s; tokenize+pack is "
                f"{data['pack_vs_fastest_training']:.0f}× the fastest variant's training tokens/s.")
    return head + "\n".join(lines) + tail + "\n"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="cli.py bench train", description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", choices=PRESETS, default="cpu")
    p.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    for key in ("seq_len", "batch", "window", "moba_block_size", "steps", "repeats"):
        p.add_argument(f"--{key.replace('_', '-')}", dest=key, type=positive_int, default=None)
    p.add_argument("--no-data", dest="data", action="store_false", help="skip the data pipeline timing")
    p.add_argument("--out", default="outputs/bench")
    return p


def main(argv: list[str] | None = None):
    args = build_parser().parse_args(argv)
    for key, value in PRESETS[args.preset].items():
        if getattr(args, key, None) is None:
            setattr(args, key, value)
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("error: --preset paper needs a CUDA GPU; use --preset cpu on this machine.")
    rows, data = run(args)
    text = markdown(rows, data, args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    write_text(out / f"train_{args.preset}.md", text)
    print(text)
    return rows, data
