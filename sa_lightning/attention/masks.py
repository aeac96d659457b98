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


#: the random keys' counter-based hash: 32-bit values held in int64, every product below 2**63 (multipliers
#: below 2**31), so CPU tensors, Triton's integers, numpy's uint64 and Python's ints compute the same bits
HASH_MASK = 0xFFFFFFFF
HASH_ROW, HASH_COL = 0x61C88647, 0x2545F491
HASH_MIX = (0x7FEB352D, 0x046CA68B)
#: the seeds a draw holds lie in [0, SEED_LIMIT)
SEED_LIMIT = 1 << 31


def mix32(x):
    """A 32-bit finalizer (xorshift, multiply, twice): a bijection on [0, 2**32) that spreads every input bit over
    the output, for int64 tensors or Python ints."""
    x = x ^ (x >> 16)
    x = (x * HASH_MIX[0]) & HASH_MASK
    x = x ^ (x >> 15)
    x = (x * HASH_MIX[1]) & HASH_MASK
    return x ^ (x >> 16)


def pair_hash(seed, i, j):
    """32 uniform bits for the pair (query i, key j) under ``seed``: row i's stream is seeded by mix32(seed + i *
    HASH_ROW), and the pair is element j of it (a counter-based draw: no state, any pair in any order)."""
    return mix32((mix32((seed + i * HASH_ROW) & HASH_MASK) + j * HASH_COL) & HASH_MASK)


def random_thresholds(lengths: torch.Tensor, window: int) -> torch.Tensor:
    """floor(p * 2**32) per row as int64, p = min(1, (2*ceil(w/2) - 2) / (L - 1)) for L valid tokens (0 for L <= 1):
    a pair is a key where its hash lies below its row's threshold. Float64 IEEE arithmetic, so every device gives
    the same integers."""
    L = lengths.to(torch.float64)
    p = torch.clamp(sa_band_others(window) / (L - 1).clamp(min=1), max=1.0)
    p = torch.where(L > 1, p, torch.zeros_like(p))
    return torch.floor(p * 2.0 ** 32).to(torch.int64)


def random_keys(seeds: torch.Tensor, window: int, n: int, lengths: torch.Tensor | None = None) -> MaskMod:
    """The random-keys control: query i reads itself and each earlier key j < i of its row's valid tokens where
    pair_hash(seed, i, j) falls below the row's threshold (each pair independently at SA's connection
    probability). ``seeds`` (1 or B,) int64 (one per row, or one shared), ``lengths`` (B,) or None for n valid
    tokens. Nothing n x n is stored: FlexAttention evaluates it tile by tile, the dense paths on the whole grid."""
    L = torch.full((1,), n, device=seeds.device) if lengths is None else lengths.to(seeds.device)
    rows = max(seeds.shape[0], L.shape[0])
    seed = seeds.long().expand(rows) if seeds.shape[0] == 1 else seeds.long()
    L = L.long().expand(rows) if L.shape[0] == 1 else L.long()
    thr = random_thresholds(L, window)

    def mask(b, h, q_idx, kv_idx):
        r = b if rows > 1 else torch.zeros_like(b)
        i, j = q_idx.long(), kv_idx.long()
        drawn = (j < i) & (i < L[r]) & (pair_hash(seed[r], i, j) < thr[r])
        return (j == i) | drawn

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


#: grid points a mask function is evaluated on at once by ``dense``: its temporaries (the random control's int64
#: hash: several of 8 bytes per point) stay near 32 MB each however large the grid; the result is 1 byte per point
DENSE_CHUNK = 1 << 22


def dense(mask: MaskMod, n: int, batch: int = 1, heads: int = 1, device=None,
          chunk: int = DENSE_CHUNK) -> torch.Tensor:
    """Evaluate a mask function on the full (batch, heads, n, n) grid, ``chunk`` grid points of query rows at a
    time (the result broadcast over the batch and heads it does not depend on)."""
    b = torch.arange(batch, device=device).view(-1, 1, 1, 1)
    h = torch.arange(heads, device=device).view(1, -1, 1, 1)
    kv_idx = torch.arange(n, device=device).view(1, 1, 1, -1)
    rows = max(1, chunk // max(1, batch * heads * n))
    parts = [mask(b, h, torch.arange(s, min(s + rows, n), device=device).view(1, 1, -1, 1), kv_idx)
             for s in range(0, n, rows)]
    lead = (max(p.shape[0] for p in parts), max(p.shape[1] for p in parts))
    whole = parts[0] if len(parts) == 1 else torch.cat([p.expand(*lead, -1, n) for p in parts], dim=2)
    return whole.expand(batch, heads, n, n)
