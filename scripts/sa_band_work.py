"""How much of SA's band a blocked kernel must compute, and how much a position-sorted one could skip.

    python scripts/sa_band_work.py                  # n=8192, w=256: the issue-17 setting
    python scripts/sa_band_work.py --n 16384 --window 512 --seeds 4

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
- ``sorted, batched``: the staircase batched over blocks, each sub-tile padded to the widest block.

and the SA+SWA/SWA ratio each would give if time were proportional to computed key columns, the SWA band
costing what it costs today (a lower bound: sorting, the extra gathers and the smaller matmuls are free
here). docs/benchmarks.md quotes its output.
"""
from __future__ import annotations

import argparse

import torch

from sa_lightning.attention.masks import sa_half_width


def in_place_width(before: int, after: int, blk: int) -> int:
    """Key columns per query window of the in-place kernel (windows start on block boundaries)."""
    lead = -(-before // blk) * blk
    return -(-(lead + blk + after) // blk) * blk


def count(n: int, window: int, blk: int, tiles: int, seed: int) -> dict[str, float]:
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
    return {"valid": valid, "in-place": float(in_place_width(h, h, blk)),
            "sorted, ragged": widths.float().mean().item(),
            "sorted, batched": widths.max(0).values.float().mean().item()}


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=8192)
    parser.add_argument("--window", type=int, default=256)
    parser.add_argument("--blocks", type=int, nargs="+", default=[32, 64, 128, 256])
    parser.add_argument("--tiles", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--seeds", type=int, default=3)
    args = parser.parse_args(argv)
    rows = []
    print(f"n={args.n}, w={args.window}: key columns computed per SA query; SA+SWA/SWA if time ~ columns")
    print("| query block | sub-tiles | valid | in-place | sorted, ragged | sorted, batched | ratio, ragged | "
          "ratio, batched |")
    print("|---|---|---|---|---|---|---|---|")
    for blk in args.blocks:
        swa = in_place_width(args.window - 1, 0, blk)
        for tiles in (t for t in args.tiles if blk % t == 0):
            runs = [count(args.n, args.window, blk, tiles, seed) for seed in range(args.seeds)]
            row = {key: sum(r[key] for r in runs) / len(runs) for key in runs[0]}
            row.update(block=blk, tiles=tiles, swa=swa)
            rows.append(row)
            print(f"| {blk} | {tiles} | {row['valid']:.0f} | {row['in-place']:.0f} | {row['sorted, ragged']:.0f} | "
                  f"{row['sorted, batched']:.0f} | {1 + row['sorted, ragged'] / swa:.2f} | "
                  f"{1 + row['sorted, batched'] / swa:.2f} |", flush=True)
    return rows


if __name__ == "__main__":
    main()
