"""The dense float64 oracle: softmax attention under a mask built straight from ``masks``.

It materialises n x n matrices, so it is for tests and correctness checks only. Every fast path is
checked against it.
"""
from __future__ import annotations

import math

import numpy as np

import torch

from . import masks
from .masks import HASH_COL, HASH_MASK, HASH_MIX, HASH_ROW
from .permutation import invert_permutation


def reference_attention(q, k, v, mask: torch.Tensor, scale: float | None = None) -> torch.Tensor:
    """Float64 masked attention; ``mask`` is (B or 1, Hq or 1, n, n) bool. Returns q's dtype.

    Row i is exactly sum over the keys j it sees of p_ij * v_j: a masked key's score is set to -inf (never
    added to), and a masked value never enters the sum, so a NaN or inf key or value changes only the rows
    that see it (there 0 * inf, for a seen value whose weight is 0, is NaN, as the sum says).
    """
    B, Hq, n, d = q.shape
    G = Hq // k.shape[1]
    q64, k64, v64 = (t.double() for t in (q, k, v))
    k64, v64 = k64.repeat_interleave(G, dim=1), v64.repeat_interleave(G, dim=1)
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    scores = (q64 @ k64.transpose(-1, -2)) * scale
    scores = scores.masked_fill(~mask, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    finite = torch.isfinite(v64)
    out = probs @ torch.where(finite, v64, 0.0)
    cols = (~finite).flatten(0, 1).any(0).any(-1).nonzero().squeeze(1)  # keys with a non-finite value somewhere
    if cols.numel():  # add their non-finite parts, only where seen: (B, Hq, n, |cols|, d), small
        seen = mask.expand(B, Hq, n, n)[..., cols].unsqueeze(-1)
        bad = torch.where(finite, 0.0, v64)[:, :, cols].unsqueeze(2)
        out = out + torch.where(seen, probs[..., cols].unsqueeze(-1) * bad, 0.0).sum(-2)
    return out.to(q.dtype)


def slots_of(perm: torch.Tensor, batch: int) -> torch.Tensor:
    """(B, n) slot of every token for a (n,) or (B, n) gather-index permutation."""
    slot = invert_permutation(perm)
    return slot.expand(batch, -1) if slot.dim() == 2 else slot.unsqueeze(0).expand(batch, -1)


def full_mask(n: int, device=None) -> torch.Tensor:
    return masks.dense(masks.causal, n, device=device)


def swa_mask(n: int, window: int, device=None) -> torch.Tensor:
    return masks.dense(masks.sliding_window(window), n, device=device)


def sa_mask(perm: torch.Tensor, window: int, batch: int, lengths: torch.Tensor | None = None) -> torch.Tensor:
    slot = slots_of(perm, batch)
    return masks.dense(masks.stochastic(slot, window, lengths), slot.shape[-1], batch=batch, device=perm.device)


def sa_swa_union_mask(perm: torch.Tensor, window: int, batch: int, lengths: torch.Tensor | None = None) -> torch.Tensor:
    """The training-free SA+SWA mask: SA's or SWA's (one softmax over both key sets)."""
    slot = slots_of(perm, batch)
    mask = masks.union(masks.stochastic(slot, window, lengths), masks.sliding_window(window))
    return masks.dense(mask, slot.shape[-1], batch=batch, device=perm.device)


def sa_bucket_mask(perm: torch.Tensor, window: int, batch: int, lengths: torch.Tensor | None = None) -> torch.Tensor:
    """(B, 1, n, n): bucketed SA, written out bucket by bucket, independently of ``masks.bucketed``: the valid
    slots cut into runs of b = 2 * ceil(w/2) - 1, and each token reading the earlier tokens of its run."""
    rows = perm.expand(batch, -1) if perm.dim() == 1 else perm
    n = rows.shape[-1]
    b = 2 * math.ceil(window / 2) - 1
    out = torch.eye(n, dtype=torch.bool).expand(batch, 1, n, n).clone()  # padding reads itself: a finite oracle
    for r, tokens in enumerate(rows.cpu().tolist()):
        valid = n if lengths is None else int(lengths[r])
        for start in range(0, valid, b):
            run = tokens[start:min(start + b, valid)]
            for i in run:
                for j in run:
                    out[r, 0, i, j] = j <= i
    return out.to(perm.device)


def strided_mask(n: int, window: int, batch: int, lengths: torch.Tensor | None = None, device=None) -> torch.Tensor:
    """(B, 1, n, n): query i reads j <= i with (i - j) mod s == 0, s = ceil((L - 1) / (2 * ceil(w/2) - 2)) for
    the row's L valid tokens; written out row by row, independently of ``masks.strided``."""
    rows = [n] * batch if lengths is None else [int(x) for x in lengths.tolist()]
    out = torch.zeros(batch, 1, n, n, dtype=torch.bool)
    per = 2 * math.ceil(window / 2) - 2
    for b, length in enumerate(rows):
        s = max(1, math.ceil((length - 1) / per))
        for i in range(n):
            out[b, 0, i, i % s:i + 1:s] = True  # j = i, i - s, ..., down to i mod s
    return out.to(device)


def strided_swa_union_mask(n: int, window: int, batch: int, lengths: torch.Tensor | None = None,
                           device=None) -> torch.Tensor:
    """The strided pattern or SWA's window (one softmax over both key sets)."""
    return strided_mask(n, window, batch, lengths, device) | swa_mask(n, window, device)


def strided_local_mask(n: int, window: int, batch: int, lengths: torch.Tensor | None = None, device=None,
                       depth: int | None = None) -> torch.Tensor:
    """(B, 1, n, n): query i reads j <= i with i - j <= h or (i - j) mod s == 0, (h, s) the row's own
    (``strided_local.local_stride`` at ``depth``); written out row by row, independently of ``strided_local.strided_local_mask``."""
    from .strided_local import local_stride

    rows = [n] * batch if lengths is None else [int(x) for x in lengths.tolist()]
    out = torch.zeros(batch, 1, n, n, dtype=torch.bool)
    for b, length in enumerate(rows):
        h, s, _ = local_stride(length, window, depth)
        for i in range(n):
            out[b, 0, i, max(0, i - h):i + 1] = True
            out[b, 0, i, i % s:i + 1:s] = True
    return out.to(device)


def radix_mask(n: int, window: int, batch: int, lengths: torch.Tensor | None = None, device=None,
               depth: int | None = None) -> torch.Tensor:
    """(B, 1, n, n): query i reads j = i and j = i - o for each of the row's digit offsets o
    (``radix.radix_offsets`` of its own length at ``depth``); written out row by row, independently of
    ``radix.radix_mask``."""
    from .radix import radix_offsets

    rows = [n] * batch if lengths is None else [int(x) for x in lengths.tolist()]
    out = torch.zeros(batch, 1, n, n, dtype=torch.bool)
    for b, length in enumerate(rows):
        offsets = radix_offsets(max(length, 1), window, depth)
        for i in range(n):
            out[b, 0, i, i] = True
            for o in offsets:
                if o <= i:
                    out[b, 0, i, i - o] = True
    return out.to(device)


def strided_local_swa_union_mask(n: int, window: int, batch: int, lengths: torch.Tensor | None = None,
                                 device=None, depth: int | None = None) -> torch.Tensor:
    """The local-band strided pattern or SWA's window (one softmax over both key sets)."""
    return strided_local_mask(n, window, batch, lengths, device, depth) | swa_mask(n, window, device)


def _mix32_numpy(x):
    """masks.mix32 in numpy's uint64, wrapping where int64 would not need to: the same bits, another arithmetic."""
    x = x ^ (x >> np.uint64(16))
    x = (x * np.uint64(HASH_MIX[0])) & np.uint64(HASH_MASK)
    x = x ^ (x >> np.uint64(15))
    x = (x * np.uint64(HASH_MIX[1])) & np.uint64(HASH_MASK)
    return x ^ (x >> np.uint64(16))


def random_mask(seeds: torch.Tensor, window: int, batch: int, n: int, lengths: torch.Tensor | None = None
                ) -> torch.Tensor:
    """(B, 1, n, n): query i < L reads itself and each j < i whose pair hash under its row's seed lies below
    floor(p * 2**32), p = min(1, (2*ceil(w/2) - 2) / (L - 1)); a padded query reads itself. Hashed in numpy's
    uint64 from the constants alone, independently of ``masks.random_keys``'s tensors."""
    device, seeds = seeds.device, seeds.cpu().view(-1).tolist()
    sizes = [n] * batch if lengths is None else [int(x) for x in lengths.view(-1).tolist()]
    sizes = sizes * batch if len(sizes) == 1 else sizes  # one length for every row, as the mask function takes it
    out = torch.zeros(batch, 1, n, n, dtype=torch.bool)
    i = np.arange(n, dtype=np.uint64).reshape(-1, 1)
    j = np.arange(n, dtype=np.uint64).reshape(1, -1)
    for b in range(batch):
        seed, L = np.uint64(seeds[b if len(seeds) > 1 else 0]), sizes[b]
        p = min(1.0, (2 * math.ceil(window / 2) - 2) / (L - 1)) if L > 1 else 0.0
        row = _mix32_numpy((seed + i * np.uint64(HASH_ROW)) & np.uint64(HASH_MASK))
        h = _mix32_numpy((row + j * np.uint64(HASH_COL)) & np.uint64(HASH_MASK))
        drawn = (h < np.uint64(math.floor(p * 2.0 ** 32))) & (j < i) & (i < L)
        out[b, 0] = torch.from_numpy(drawn | (i == j))
    return out.to(device)


def random_swa_union_mask(seeds: torch.Tensor, window: int, batch: int, n: int, lengths=None) -> torch.Tensor:
    """The random keys or SWA's window (one softmax over both key sets)."""
    return random_mask(seeds, window, batch, n, lengths) | swa_mask(n, window, seeds.device)


def reference_moba_selection(q, k, block_size: int, top_k: int) -> torch.Tensor:
    """(B, Hq, n, nblk) bool: the past blocks each query selects, gated in float64."""
    B, Hq, n, d = q.shape
    G = Hq // k.shape[1]
    nblk = -(-n // block_size)
    k64 = k.double().repeat_interleave(G, dim=1)
    means = torch.stack([k64[:, :, c * block_size:(c + 1) * block_size].mean(2) for c in range(nblk)], 2)
    gate = q.double() @ means.transpose(-1, -2)  # (B, Hq, n, nblk)
    own = torch.arange(n, device=q.device) // block_size
    past = torch.arange(nblk, device=q.device).view(1, -1) < own.view(-1, 1)
    gate = gate.masked_fill(~past | gate.isnan(), float("-inf"))  # a NaN gate never selects its block
    selected = torch.zeros_like(gate, dtype=torch.bool)
    picks = min(top_k - 1, nblk)
    if picks > 0:
        vals, idx = gate.topk(picks, dim=-1)
        selected.scatter_(-1, idx, vals > float("-inf"))
    return selected


def moba_mask(q, k, block_size: int, top_k: int) -> torch.Tensor:
    B, Hq, n, _ = q.shape
    selected = reference_moba_selection(q, k, block_size, top_k)
    return masks.dense(masks.moba(selected, block_size), n, batch=B, heads=Hq, device=q.device)
