"""Every attention pattern as a tiny mask function, in the FlexAttention ``mask_mod`` signature.

A mask function takes broadcastable index tensors ``(b, h, q_idx, kv_idx)`` and returns a bool tensor
that is True where query ``q_idx`` may read key ``kv_idx``. The same functions drive the dense
short-sequence path, the float64 oracle, the FlexAttention path and the analysis tools.
"""
from __future__ import annotations

import math
from typing import Callable

import torch

MaskMod = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def sa_half_width(window: int) -> int:
    """Largest circular slot distance inside the SA window: |a - b|_n < w/2  <=>  |a - b|_n <= this."""
    return math.ceil(window / 2) - 1


def sa_band_others(window: int) -> int:
    """2⌈w/2⌉ − 2: the other slots in SA's band of a query (the band holds 2 * ``sa_half_width`` + 1 slots, its
    own included). About half of them hold earlier tokens, which the query reads. The random and strided
    controls are sized to read as many keys (their budget); SA's band is the one place this number is defined."""
    return 2 * sa_half_width(window)


def circular_distance(a: torch.Tensor, b: torch.Tensor, n: int) -> torch.Tensor:
    diff = (a - b).abs()
    return torch.minimum(diff, n - diff)


def _row(table: torch.Tensor):
    """Index rows of a (B, n) table by batch index; a (1, n) table is shared by the batch."""
    return (lambda b: b) if table.shape[0] > 1 else (lambda b: b * 0)


def causal(b, h, q_idx, kv_idx):
    return kv_idx <= q_idx


def sliding_window(window: int) -> MaskMod:
    """Query i reads key j when 0 <= i - j <= window - 1."""

    def mask(b, h, q_idx, kv_idx):
        delta = q_idx - kv_idx
        return (delta >= 0) & (delta < window)

    return mask


def stochastic(slot: torch.Tensor, window: int, lengths: torch.Tensor | None = None) -> MaskMod:
    """SA in original token space: j <= i and |slot(i) - slot(j)|_n < w/2.

    ``slot`` is (B, n), or (1, n) for a shared permutation: ``slot[b, token]`` is the token's slot.
    With ``lengths`` (B,), row b's valid tokens fill its first lengths[b] slots: the circular distance
    is taken modulo lengths[b], and tokens in later slots (padding) are never read.
    """
    n, half, row = slot.shape[-1], sa_half_width(window), _row(slot)

    def mask(b, h, q_idx, kv_idx):
        s_q, s_k = slot[row(b), q_idx], slot[row(b), kv_idx]
        if lengths is None:
            return (kv_idx <= q_idx) & (circular_distance(s_q, s_k, n) <= half)
        size = lengths[b]
        return (kv_idx <= q_idx) & (circular_distance(s_q, s_k, size) <= half) & (s_k < size)

    return mask


def bucketed(slot: torch.Tensor, window: int, lengths: torch.Tensor | None = None) -> MaskMod:
    """Bucketed SA in original token space: j <= i and slot(i) // b == slot(j) // b, b = 2⌈w/2⌉ − 1 (the buckets
    of consecutive slots; ``slot`` as ``stochastic``'s). With ``lengths``, tokens in slots at or past lengths[b]
    (padding) are never read."""
    size, row = sa_band_others(window) + 1, _row(slot)

    def mask(b, h, q_idx, kv_idx):
        s_q, s_k = slot[row(b), q_idx], slot[row(b), kv_idx]
        same = (kv_idx <= q_idx) & (torch.div(s_q, size, rounding_mode="floor")
                                    == torch.div(s_k, size, rounding_mode="floor"))
        return same if lengths is None else same & (s_k < lengths[b])

    return mask


def stochastic_in_slots(pos: torch.Tensor, window: int, length: "torch.Tensor | int | None" = None) -> MaskMod:
    """SA in permuted (slot) space: slots within the circular band, causal on original positions.

    ``pos`` is (B or 1, n): ``pos[b, s]`` is the original position of the token in slot ``s`` (the perm).
    ``length`` (a 0-d tensor, or an int) marks a call padded past the real slots: the band wraps at it, no slot
    at or past it is read, and ``pos`` may stop at it (indices past its end are clamped; FlexAttention inside a
    compiled model captures the drawn table unpadded).
    """
    half, row = sa_half_width(window), _row(pos)
    if length is None:
        n = pos.shape[-1]

        def mask(b, h, q_idx, kv_idx):
            r = row(b)
            near = circular_distance(q_idx, kv_idx, n) <= half
            return near & (pos[r, kv_idx] <= pos[r, q_idx])

        return mask
    last = pos.shape[-1] - 1

    def padded(b, h, q_idx, kv_idx):
        r = row(b)
        near = (circular_distance(q_idx, kv_idx, length) <= half) & (kv_idx < length)
        return near & (pos[r, torch.clamp(kv_idx, max=last)] <= pos[r, torch.clamp(q_idx, max=last)])

    return padded


def strided(window: int, n: int, lengths: torch.Tensor | None = None) -> MaskMod:
    """The strided control: j <= i and (i - j) mod s = 0, s = ceil((L - 1) / (2 * ceil(w/2) - 2)) for a row of
    L valid tokens (n without ``lengths``; w >= 3)."""
    per = sa_band_others(window)
    fixed = max(1, math.ceil((n - 1) / per))

    def mask(b, h, q_idx, kv_idx):
        s = fixed if lengths is None else torch.clamp(torch.div(lengths[b] - 1 + per - 1, per, rounding_mode="floor"),
                                                      min=1)
        return (kv_idx <= q_idx) & ((q_idx - kv_idx) % s == 0)

    return mask


def random_keys(table: torch.Tensor) -> MaskMod:
    """The random-keys control from its drawn key table, (n, K) or (B, n, K) with -1 for no key: query i reads
    itself and the keys of its row. Scattered once into a (1 or B, n, n) grid (the dense paths' use)."""
    table = table if table.dim() == 3 else table.unsqueeze(0)
    rows, n, _ = table.shape
    grid = torch.zeros(rows, n, n + 1, dtype=torch.bool, device=table.device)
    grid.scatter_(2, torch.where(table < 0, n, table), True)  # -1 lands in a spare last column
    grid = grid[..., :n] | torch.eye(n, dtype=torch.bool, device=table.device)

    def mask(b, h, q_idx, kv_idx):
        return grid[b if rows > 1 else torch.zeros_like(b), q_idx, kv_idx]

    return mask


def moba(selected: torch.Tensor, block_size: int) -> MaskMod:
    """MoBA: j <= i and block(j) is i's own block or one of i's selected past blocks.

    ``selected`` is (B, H, n, nblk) bool: ``selected[b, h, i, c]`` marks past block c chosen by query i.
    """

    def mask(b, h, q_idx, kv_idx):
        q_blk, kv_blk = q_idx // block_size, kv_idx // block_size
        chosen = selected[b, h, q_idx, kv_blk]
        return (kv_idx <= q_idx) & ((q_blk == kv_blk) | chosen)

    return mask


def moba_picks(picks: torch.Tensor, block_size: int) -> MaskMod:
    """MoBA from each query's picked block indices: ``picks`` is (B, H, n, P) long, -1 where a query has
    no pick. The same pattern as ``moba`` with a table of n * P entries per head instead of n * nblk."""
    count = picks.shape[-1]

    def mask(b, h, q_idx, kv_idx):
        kv_blk = kv_idx // block_size
        out = (kv_idx <= q_idx) & (kv_blk == q_idx // block_size)
        for p in range(count):  # picks are strictly past blocks: causal by construction
            out = out | (picks[b, h, q_idx, p] == kv_blk)
        return out

    return mask


def union(*masks: MaskMod) -> MaskMod:
    def mask(b, h, q_idx, kv_idx):
        out = masks[0](b, h, q_idx, kv_idx)
        for other in masks[1:]:
            out = out | other(b, h, q_idx, kv_idx)
        return out

    return mask


def dense(mask: MaskMod, n: int, batch: int = 1, heads: int = 1, device=None) -> torch.Tensor:
    """Evaluate a mask function on the full (batch, heads, n, n) grid."""
    b = torch.arange(batch, device=device).view(-1, 1, 1, 1)
    h = torch.arange(heads, device=device).view(1, -1, 1, 1)
    q_idx = torch.arange(n, device=device).view(1, 1, -1, 1)
    kv_idx = torch.arange(n, device=device).view(1, 1, 1, -1)
    return mask(b, h, q_idx, kv_idx).expand(batch, heads, n, n)
