"""Bucketed SA's kernels: the permuted sequence cut into buckets of consecutive slots, each bucket's tokens put
back in their original order, and ordinary causal attention inside each bucket.

A bucket holds ``bucket_size(w)`` = 2⌈w/2⌉ − 1 slots, as many as SA's band, so a pair of tokens shares a bucket
with SA's connection probability (b − 1)/(n − 1) (for n a multiple of b), but the neighbourhoods are disjoint
(a partition of the tokens) instead of overlapping bands, and no mask function is needed: each bucket is a short
causal sequence for the stock kernel (``scaled_dot_product_attention``: the fused kernel on a CPU, flash on CUDA).
With padding (``lengths``), a row's valid tokens fill its first slots (σ keeps the padding last) and come after
no padding token in their bucket, so a valid query never reads one.

Pure functions of tensors: the bucket order is a sort on the device, with no host sync.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .dense import dense_masked_attention
from .masks import sa_band_others


def bucket_size(window: int) -> int:
    """b = 2⌈w/2⌉ − 1: the slots of SA's band (its own and ``sa_band_others``)."""
    return sa_band_others(window) + 1


def bucket_order(perm: torch.Tensor, b: int) -> torch.Tensor:
    """(P, nb * b) long: the tokens of each bucket of ``b`` consecutive slots of ``perm`` ((P, n) gather index),
    in ascending original position; the last bucket is filled up with ``n`` (a spare zero row), which sorts last."""
    n = perm.shape[-1]
    padded = F.pad(perm, (0, (-n) % b), value=n)
    return padded.view(perm.shape[0], -1, b).sort(dim=-1).values.view(perm.shape[0], -1)


def _to_buckets(x: torch.Tensor, order: torch.Tensor, b: int) -> torch.Tensor:
    """x (B, H, n, d) in bucket order: (B * nb, H, b, d). ``order`` is (B, nb * b) and may name the spare row n."""
    B, H, _, d = x.shape
    spare = F.pad(x, (0, 0, 0, 1))
    y = spare.gather(2, order.view(B, 1, -1, 1).expand(B, H, -1, d))  # (B, H, nb * b, d)
    return y.view(B, H, -1, b, d).transpose(1, 2).reshape(-1, H, b, d)


def _from_buckets(y: torch.Tensor, order: torch.Tensor, n: int) -> torch.Tensor:
    """The inverse of ``_to_buckets`` for an output (B * nb, H, b, d): (B, H, n, d) in token order."""
    B = order.shape[0]
    _, H, b, d = y.shape
    flat = y.view(B, -1, H, b, d).transpose(1, 2).reshape(B, H, -1, d)  # (B, H, nb * b, d)
    slots = torch.arange(order.shape[-1], device=order.device).expand(B, -1)
    where = torch.empty(B, n + 1, dtype=order.dtype, device=order.device).scatter_(1, order, slots)[:, :n]
    return flat.gather(2, where.view(B, 1, n, 1).expand(B, H, n, d))


def _order(perm: torch.Tensor, batch: int, b: int) -> torch.Tensor:
    perm = perm if perm.dim() == 2 else perm.unsqueeze(0)
    return bucket_order(perm, b).expand(batch, -1)


def bucketed_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int, perm: torch.Tensor, *,
                       scale: float) -> torch.Tensor:
    """Bucketed SA, q (B, Hq, n, d), k, v (B, Hkv, n, d), ``perm`` σ's gather index (n,) or (B, n): each bucket
    through ``scaled_dot_product_attention`` with its causal mask (grouped-query heads as they come)."""
    B, Hq, n, _ = q.shape
    b = bucket_size(window)
    order = _order(perm, B, b)
    qb, kb, vb = (_to_buckets(t, order, b) for t in (q, k, v))
    y = F.scaled_dot_product_attention(qb, kb, vb, is_causal=True, scale=scale, enable_gqa=Hq != k.shape[1])
    return _from_buckets(y, order, n)


def bucketed_attention_lse(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int, perm: torch.Tensor, *,
                           scale: float, skip_recent: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(output, log-sum-exp (B, Hq, n)) of bucketed SA, for merging with other key sets (sinks, SWA's window in
    the union). ``skip_recent`` > 0 leaves out the keys at distance below it (those SWA's window holds), so a
    union counts no key twice; a query left with no key has log-sum-exp -inf and output 0."""
    B, Hq, n, _ = q.shape
    b = bucket_size(window)
    order = _order(perm, B, b)
    qb, kb, vb = (_to_buckets(t, order, b) for t in (q, k, v))
    pos = order.reshape(-1, b)  # each bucket's positions, ascending (the spare n last)
    mask = (pos.unsqueeze(-1) >= pos.unsqueeze(-2)) & (pos.unsqueeze(-2) < n)  # causal; the spare row never read
    if skip_recent:
        mask = mask & (pos.unsqueeze(-1) - pos.unsqueeze(-2) >= skip_recent)
    y, lse = dense_masked_attention(qb, kb, vb, mask.unsqueeze(1), scale=scale, return_lse=True)
    return _from_buckets(y, order, n), _from_buckets(lse.unsqueeze(-1), order, n).squeeze(-1)
