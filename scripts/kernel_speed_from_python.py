"""Kernel speed from plain Python: the attention functions imported as a library, with nothing of cli.py.

    python scripts/kernel_speed_from_python.py            # the issue-17 setting: B=1, H=4, d=64, w=256, fp32
    SA_LIGHTNING_DEFAULT_MALLOC=1 python scripts/kernel_speed_from_python.py   # glibc's defaults, to compare

Times forward+backward of full causal SDPA, SWA, SA and gated SA+SWA (both paths) at n = 2k, 8k and 16k,
interleaved within each repeat so that the ratios share the machine's state, and prints the medians and
the ratios that docs/benchmarks.md records: SA t(16k)/t(2k), full/SA at 16k, SA/SWA at 8k, SA+SWA/SWA at 8k.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from sa_lightning.attention import AttentionSpec, get_variant, invert_permutation, sample_permutation


def step(variant: str, q, k, v, window: int, perm, inv) -> None:
    out = get_variant(variant)(q, k, v, AttentionSpec(variant, window=window), perm, None, inv)
    sum(y.sum() for y in out).backward()
    q.grad = k.grad = v.grad = None


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--lengths", type=int, nargs="+", default=[2048, 8192, 16384])
    p.add_argument("--variants", nargs="+", default=["full", "swa", "sa", "sa_swa"])
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--window", type=int, default=256)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2)
    args = p.parse_args(argv)
    torch.manual_seed(0)
    times: dict[tuple[str, int], list[float]] = {}
    for n in args.lengths:
        q, k, v = (torch.randn(args.batch, args.heads, n, args.dim, requires_grad=True) for _ in range(3))
        draws = [sample_permutation(n, generator=torch.Generator().manual_seed(i)) for i in range(args.repeats + args.warmup)]
        pairs = [(s.unsqueeze(0), invert_permutation(s.unsqueeze(0))) for s in draws]
        for r in range(args.warmup + args.repeats):
            for variant in args.variants:
                perm, inv = pairs[r]
                t0 = time.perf_counter()
                step(variant, q, k, v, args.window, perm, inv)
                if r >= args.warmup:
                    times.setdefault((variant, n), []).append(time.perf_counter() - t0)
        print(f"n={n}: " + ", ".join(f"{v} {1e3 * statistics.median(times[(v, n)]):.1f} ms" for v in args.variants),
              flush=True)
    med = {key: statistics.median(val) for key, val in times.items()}
    ratios = {}
    lo, mid, hi = min(args.lengths), 8192, max(args.lengths)
    if ("sa", lo) in med and ("sa", hi) in med:
        ratios[f"SA t({hi // 1024}k)/t({lo // 1024}k)"] = med[("sa", hi)] / med[("sa", lo)]
    if ("full", hi) in med and ("sa", hi) in med:
        ratios[f"full/SA at {hi // 1024}k"] = med[("full", hi)] / med[("sa", hi)]
    if ("swa", mid) in med and ("sa", mid) in med:
        ratios["SA/SWA at 8k"] = med[("sa", mid)] / med[("swa", mid)]
    if ("swa", mid) in med and ("sa_swa", mid) in med:
        ratios["SA+SWA/SWA at 8k"] = med[("sa_swa", mid)] / med[("swa", mid)]
    for name, value in ratios.items():
        print(f"{name}: {value:.2f}")
    return ratios


if __name__ == "__main__":
    main()
