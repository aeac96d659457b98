"""``cli.py bench attention``: forward+backward latency and peak memory of every variant over n.

Variants run interleaved within each repeat, so that their ratios share the machine's state.
Writes a CSV, a markdown table and a PNG (Figure 2, right).
"""
from __future__ import annotations

import argparse
import csv
import platform
import statistics
import time
from datetime import date
from pathlib import Path

import torch

from ..attention import AttentionSpec, get_variant, sample_permutation
from .machine import sync
from .memory import peak_bytes

PRESETS = {
    # Small enough for a 2-core CPU in under three minutes.
    "cpu": dict(batch=1, heads=4, kv_heads=4, dim=64, window=256, lengths=[1024, 2048, 4096, 8192, 16384],
                dtype="float32", device="cpu", repeats=3),
    # The paper's Table 2 setting (A100 in the paper): B=16, H=16, d=64, bf16.
    "paper": dict(batch=16, heads=16, kv_heads=16, dim=64, window=256, lengths=[2048, 4096, 8192, 16384, 32768],
                  dtype="bfloat16", device="cuda", repeats=10),
}
VARIANTS = ("full", "swa", "sa", "sa_swa", "moba")
COLORS = {"swa": "#4A90D9", "sa": "#E74C3C", "sa_swa": "#2ECC71", "full": "#7F7F7F", "moba": "#F39C12", "sa_flex": "#9B59B6"}


class Case:
    """One (variant, n) cell: fixed inputs and a fresh permutation per call, as in training."""

    def __init__(self, variant: str, n: int, args, device, dtype):
        self.variant, self.n, self.device = variant, n, device
        self.spec = AttentionSpec(variant if variant != "sa_flex" else "sa", window=args.window,
                                  block_size=max(1, args.window // args.moba_top_k), top_k=args.moba_top_k,
                                  backend="flex" if variant == "sa_flex" else args.backend)
        self.fn = get_variant(self.spec.variant)
        g = torch.Generator().manual_seed(n)
        shape = lambda h: (args.batch, h, n, args.dim)  # noqa: E731
        self.q = torch.randn(shape(args.heads), generator=g).to(device, dtype)
        self.k = torch.randn(shape(args.kv_heads), generator=g).to(device, dtype)
        self.v = torch.randn(shape(args.kv_heads), generator=g).to(device, dtype)
        self.backward = not args.forward_only and (variant != "sa_flex" or device.type == "cuda")
        for t in (self.q, self.k, self.v):
            t.requires_grad_(self.backward)
        self.gen = torch.Generator(device="cpu").manual_seed(0)

    def __call__(self):
        perm = sample_permutation(self.n, generator=self.gen, device=self.device) if self.fn.uses_permutation else None
        with torch.set_grad_enabled(self.backward):
            outs = self.fn(self.q, self.k, self.v, self.spec, perm)
            if self.backward:
                sum(o.float().sum() for o in outs).backward()
                self.q.grad = self.k.grad = self.v.grad = None

    def timed(self) -> float:
        sync(self.device)
        start = time.perf_counter()
        self()
        sync(self.device)
        return time.perf_counter() - start


def run(args) -> list[dict]:
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("error: --device cuda was asked for (the paper preset needs a GPU) but no CUDA GPU is visible.")
    rows = []
    for n in args.lengths:
        cases = [Case(v, n, args, device, dtype) for v in args.variants]
        for case in cases:  # warm-up: compilation, allocator growth
            case()
        times = {c.variant: [] for c in cases}
        for _ in range(args.repeats):
            for case in cases:
                times[case.variant].append(case.timed())
        for case in cases:
            mem = peak_bytes(case, device) if not args.no_memory else 0
            ms = statistics.median(times[case.variant]) * 1e3
            rows.append({"n": n, "variant": case.variant, "ms": ms, "peak_mib": mem / 2**20})
        cell = {r["variant"]: r for r in rows if r["n"] == n}
        line = "  ".join(f"{v} {cell[v]['ms']:.1f} ms" for v in args.variants)
        print(f"n={n:>6}: {line}", flush=True)
    _add_ratios(rows)
    return rows


def _add_ratios(rows):
    by_n = {}
    for r in rows:
        by_n.setdefault(r["n"], {})[r["variant"]] = r
    for cell in by_n.values():
        for r in cell.values():
            r["x_swa"] = r["ms"] / cell["swa"]["ms"] if "swa" in cell else float("nan")
            r["x_full"] = r["ms"] / cell["full"]["ms"] if "full" in cell else float("nan")
            r["mem_x_swa"] = (r["peak_mib"] / cell["swa"]["peak_mib"]) if "swa" in cell and cell["swa"]["peak_mib"] else float("nan")


def markdown(rows, args) -> str:
    device = torch.cuda.get_device_name() if args.device == "cuda" else (platform.processor() or platform.machine())
    head = (f"Measured {date.today().isoformat()} on {device} ({torch.get_num_threads()} threads), torch {torch.__version__}; "
            f"B={args.batch}, H={args.heads}, Hkv={args.kv_heads}, d={args.dim}, w={args.window}, {args.dtype}, "
            f"{'forward only' if args.forward_only else 'forward+backward'}, median of {args.repeats} interleaved repeats. MoBA: c={max(1, args.window // args.moba_top_k)}, "
            f"k={args.moba_top_k}. sa_flex is forward only on CPU.\n\n")
    lines = ["| n | variant | ms | × SWA | × full | peak MiB | mem × SWA |", "|---:|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['n']} | {r['variant']} | {r['ms']:.1f} | {r['x_swa']:.2f} | {r['x_full']:.3f} | "
                     f"{r['peak_mib']:.1f} | {r['mem_x_swa']:.2f} |")
    return head + "\n".join(lines) + "\n"


def plot(rows, path: Path, args) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.6))
    for variant in args.variants:
        pts = [r for r in rows if r["variant"] == variant]
        label = variant.replace("_", "+").upper().replace("+FLEX", " (flex fwd)")
        axes[0].plot([r["n"] for r in pts], [r["ms"] for r in pts], "o-", label=label, color=COLORS[variant])
        if not args.no_memory:
            axes[1].plot([r["n"] for r in pts], [r["peak_mib"] for r in pts], "o-", label=label, color=COLORS[variant])
    axes[0].set(xscale="log", yscale="log", xlabel="sequence length n", ylabel="ms (fwd+bwd)", title=f"Latency, w={args.window}")
    axes[1].set(xscale="log", yscale="log", xlabel="sequence length n", ylabel="peak MiB", title="Peak memory")
    for ax in axes:
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=150)


def build_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    parser = parser or argparse.ArgumentParser(prog="cli.py bench attention")
    parser.add_argument("--preset", choices=sorted(PRESETS), default="cpu")
    parser.add_argument("--batch", type=int)
    parser.add_argument("--heads", type=int)
    parser.add_argument("--kv-heads", type=int)
    parser.add_argument("--dim", type=int)
    parser.add_argument("--window", type=int)
    parser.add_argument("--lengths", type=int, nargs="+")
    parser.add_argument("--dtype", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--device")
    parser.add_argument("--repeats", type=int)
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=[*VARIANTS, "sa_flex"])
    parser.add_argument("--moba-top-k", type=int, default=2, help="MoBA k; its block is window // k")
    parser.add_argument("--backend", default="auto", help="attention backend for swa/sa/sa_swa")
    parser.add_argument("--no-memory", action="store_true", help="skip the peak-memory pass")
    parser.add_argument("--forward-only", action="store_true", help="time the forward pass alone")
    parser.add_argument("--out", type=Path, default=Path("outputs/bench"))
    return parser


def main(argv: list[str] | None = None) -> list[dict]:
    args = build_parser().parse_args(argv)
    for key, value in PRESETS[args.preset].items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    for name in ("batch", "heads", "kv_heads", "dim", "window", "repeats"):
        if getattr(args, name) < 1:
            raise SystemExit(f"error: --{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}.")
    if args.heads % args.kv_heads:
        raise SystemExit(f"error: --heads {args.heads} must be divisible by --kv-heads {args.kv_heads}.")
    args.out.mkdir(parents=True, exist_ok=True)
    rows = run(args)
    stem = args.out / f"attention_{args.preset}{'_fwd' if args.forward_only else ''}"
    with stem.with_suffix(".csv").open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    table = markdown(rows, args)
    stem.with_suffix(".md").write_text(table)
    plot(rows, stem.with_suffix(".png"), args)
    print("\n" + table)
    print(f"wrote {stem}.csv, {stem}.md and {stem}.png")
    return rows
