"""How much of SA's band a blocked kernel must compute, and how much a position-sorted one could skip.

    python scripts/sa_band_work.py                  # n=8192, w=256: the issue-17 setting
    python scripts/sa_band_work.py --n 16384 --window 512 --seeds 4
    python scripts/sa_band_work.py --matmuls        # also time the score matmul per sub-tile size

SA's query in slot a reads the 2*ceil(w/2) - 1 slots around it, but only the keys earlier in the text:
about half of them. A kernel that works in query blocks of consecutive slots computes every slot of the
block's window, so half its SA work is masked. The only way to skip that half is to sort each block's
queries and keys by position and compute a staircase, as causal attention skips its upper triangle: split
the sorted queries into sub-tiles, and let sub-tile t read only the keys no later than its last query.
Batched over blocks (one matmul per sub-tile), each sub-tile must read as many keys as the largest block
needs. This script counts, per query, the key columns each layout computes (no timing, only counting):

- ``valid``: the keys SA's mask lets a query read, on average (the floor for any kernel);
- ``in-place``: the window the in-place kernel computes today (``banded.multi_band_attention``);
- ``sorted, ragged``: the staircase with every block its own widths (needs one matmul per block and
  sub-tile: on CPU, per-call overhead dominates at these sizes);
- ``sorted, batched``: the staircase batched over blocks, each sub-tile padded to the widest block;
- ``sorted, grouped``: the same, with each sub-tile's blocks sorted by width into ``--groups`` batches,
  each padded to its own widest block.

and the SA+SWA/SWA ratio each would give if time were proportional to computed key columns, against SWA
as the kernel computes it today (its default query block). That is a lower bound: the sorts, the extra
gathers and the smaller matmuls' lower speed are free here. docs/benchmarks.md quotes its output.
"""
from __future__ import annotations

import argparse
import time

import torch

from sa_lightning.attention.band_common import default_block
from sa_lightning.attention.band_inplace import band_window
from sa_lightning.attention.masks import sa_half_width


def count(n: int, window: int, blk: int, tiles: int, seed: int, groups: int = 4) -> dict[str, float]:
    h = sa_half_width(window)
    pos = torch.randperm(n, generator=torch.Generator().manual_seed(seed))  # slot s holds token pos[s]
    nb = n // blk
    q_slots = torch.arange(n).view(nb, blk)
    k_slots = (q_slots[:, :1] - h + torch.arange(blk + 2 * h)) % n  # the slots any query of the block reads
    q_pos, k_pos = pos[q_slots], pos[k_slots]
    dist = (q_slots.unsqueeze(-1) - k_slots.unsqueeze(1)).abs()
    in_window = torch.minimum(dist, n - dist) <= h
    valid = (in_window & (k_pos.unsqueeze(1) <= q_pos.unsqueeze(-1))).sum(-1).float().mean().item()
    last = q_pos.sort(-1).values.view(nb, tiles, blk // tiles)[:, :, -1]  # each sub-tile's latest query
    widths = (k_pos.unsqueeze(1) <= last.unsqueeze(-1)).sum(-1)  # (nb, tiles): keys no later than it
    grouped = torch.stack([g.max(0).values for g in widths.sort(0).values.tensor_split(groups)])
    return {"valid": valid, "in-place": float(band_window(h, h, blk)[1]),
            "sorted, ragged": widths.float().mean().item(),
            "sorted, batched": widths.max(0).values.float().mean().item(),
            "sorted, grouped": grouped.float().mean().item()}


def tile_throughput(rows: int, width: int, d: int = 64, flops: float = 84e6, repeats: int = 300) -> float:
    """GFLOP/s of one batched score matmul (batch, rows, d) @ (batch, d, width) at about ``flops`` per call."""
    batch = max(1, round(flops / (2 * rows * d * width)))
    q, k = torch.randn(batch, rows, d), torch.randn(batch, d, width)
    for _ in range(20):
        torch.bmm(q, k)
    start = time.perf_counter()
    for _ in range(repeats):
        torch.bmm(q, k)
    return 2 * batch * rows * d * width * repeats / (time.perf_counter() - start) / 1e9


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=8192)
    parser.add_argument("--window", type=int, default=256)
    parser.add_argument("--blocks", type=int, nargs="+", default=[32, 64, 128, 256])
    parser.add_argument("--tiles", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--groups", type=int, default=4)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--matmuls", action="store_true", help="time the score matmul for each sub-tile size")
    args = parser.parse_args(argv)
    if any(args.n % blk for blk in args.blocks):
        parser.error(f"every --blocks size must divide --n {args.n}")
    swa = band_window(args.window - 1, 0, default_block(args.window))[1]  # today's SWA window, in key columns
    rows = []
    print(f"n={args.n}, w={args.window}: key columns computed per SA query; SA+SWA/SWA if time ~ columns")
    print(f"| query block | sub-tiles | valid | in-place | sorted, ragged | sorted, batched | sorted, {args.groups} groups "
          "| ratio, ragged | ratio, batched | ratio, grouped |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for blk in args.blocks:
        for tiles in (t for t in args.tiles if blk % t == 0):
            runs = [count(args.n, args.window, blk, tiles, seed, args.groups) for seed in range(args.seeds)]
            row = {key: sum(r[key] for r in runs) / len(runs) for key in runs[0]}
            row.update(block=blk, tiles=tiles, swa=swa)
            rows.append(row)
            print(f"| {blk} | {tiles} | {row['valid']:.0f} | {row['in-place']:.0f} | {row['sorted, ragged']:.0f} | "
                  f"{row['sorted, batched']:.0f} | {row['sorted, grouped']:.0f} | {1 + row['sorted, ragged'] / swa:.2f} | "
                  f"{1 + row['sorted, batched'] / swa:.2f} | {1 + row['sorted, grouped'] / swa:.2f} |", flush=True)
    if args.matmuls:
        print(f"score matmul, fp32, {torch.get_num_threads()} threads: 64 queries x {swa} keys (today) "
              f"{tile_throughput(64, swa):.0f} GFLOP/s; sub-tiles against 185 keys:",
              ", ".join(f"{m} queries {tile_throughput(m, 185):.0f}" for m in (64, 32, 16, 8)), "GFLOP/s")
    return rows


if __name__ == "__main__":
    main()
