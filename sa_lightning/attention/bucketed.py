"""Bucketed SA's kernels: the permuted sequence cut into buckets of consecutive slots, each bucket's tokens put
back in their original order, and ordinary causal attention inside each bucket.

A bucket holds ``bucket_size(w)`` = 2⌈w/2⌉ − 1 slots, as many as SA's band, so a pair of tokens shares a bucket
with SA's connection probability (b − 1)/(n − 1) (for n a multiple of b), but the neighbourhoods are disjoint
(a partition of the tokens) instead of overlapping bands, and no mask function is needed: each bucket is a short
causal sequence for the stock kernel (``scaled_dot_product_attention``: the fused kernel on a CPU, flash on CUDA).
With padding (``lengths``), a row's valid tokens fill its first slots (σ keeps the padding last) and come after
no padding token in their bucket, so a valid query never reads one. What a padding query's output holds is
unspecified (the kernels, ``masks.bucketed`` and the oracle each give it something finite, not the same thing;
every caller discards it), as for every variant here.

Pure functions of tensors: the bucket order is a sort on the device, with no host sync.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ._finite import checking_finite
from .dense import dense_masked_attention
from .masks import sa_band_others
from .permutation import permute_tokens
from .slots import SlotOrder


def bucket_size(window: int) -> int:
    """b = 2⌈w/2⌉ − 1: the slots of SA's band (its own and ``sa_band_others``)."""
    return sa_band_others(window) + 1


def bucket_order(perm: torch.Tensor, b: int) -> torch.Tensor:
    """(P, nb * b) long: the tokens of each bucket of ``b`` consecutive slots of ``perm`` ((P, n) gather index),
    in ascending original position; the last bucket is filled up with ``n`` (a spare slot past every token), which
    sorts last, so no real query's causal mask reaches it."""
    n = perm.shape[-1]
    padded = F.pad(perm, (0, (-n) % b), value=n)
    return padded.view(perm.shape[0], -1, b).sort(dim=-1).values.view(perm.shape[0], -1)


def _plan(perm: torch.Tensor, batch: int | None, b: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(order, gather index, inverse), each (batch, ·) (``batch`` None: as many rows as ``perm``):
    ``bucket_order``; it with the spare n clamped to a real row (the spare slots close the last bucket, so no
    real query reads them); each token's place in it."""
    perm = perm if perm.dim() == 2 else perm.unsqueeze(0)
    batch = batch or perm.shape[0]
    order = bucket_order(perm, b).expand(batch, -1)
    n = perm.shape[-1]
    slots = torch.arange(order.shape[-1], device=order.device).expand(batch, -1)
    inverse = torch.empty(batch, n + 1, dtype=order.dtype, device=order.device).scatter_(1, order, slots)[:, :n]
    return order, order.clamp(max=n - 1), inverse


def bucket_slots(perm: torch.Tensor, window: int) -> SlotOrder:
    """Bucketed SA's layer order (``attention.slots``): the buckets one after another, each in original order."""
    order, index, inverse = _plan(perm, None, bucket_size(window))
    return SlotOrder(pos=order, index=index, inverse=inverse)


def bucketed_in_slots(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int, *, scale: float) -> torch.Tensor:
    """Bucketed SA on q (B, Hq, m, d), k, v (B, Hkv, m, d) already in ``bucket_slots`` order (m a whole number of
    buckets): each bucket one batch entry of ``scaled_dot_product_attention`` with its causal mask, read through
    views of the projections' (B, m, H, d) rows where their strides allow, and the output the same way."""
    B, Hq, m, d = q.shape
    b = bucket_size(window)

    def buckets(t):  # (B, H, m, d) -> (B * nb, H, b, d): no copy for a head-split projection's view
        return t.transpose(1, 2).reshape(B * (m // b), b, t.shape[1], d).transpose(1, 2)

    y = F.scaled_dot_product_attention(buckets(q), buckets(k), buckets(v), is_causal=True, scale=scale,
                                       enable_gqa=k.shape[1] != Hq)
    if checking_finite():  # as in ``bucketed_attention``: a NaN query of a short sequence gives NaN here too
        y = y + buckets(q).sum(-1, keepdim=True) * 0
    return y.transpose(1, 2).reshape(B, m, Hq, d).transpose(1, 2)


def _to_buckets(x: torch.Tensor, index: torch.Tensor, inverse: torch.Tensor, b: int, heads: int) -> torch.Tensor:
    """x (B, H, n, d) in bucket order, as (B * heads, nb, b, d): each (batch, head) one batch entry of the kernel
    and its buckets the kernel's heads (so no launch grid holds B * H * nb, which passes CUDA's 65535 at long n),
    each of H heads repeated heads / H times (a grouped-query k or v beside its q heads; no copy when heads == H)."""
    B, H, n, d = x.shape
    y = permute_tokens(x, index, inverse, n).view(B, H, -1, b, d)  # (B, H, nb, b, d)
    if heads != H:  # one kv head may give a stride-0 view here: reshape copies where a view cannot serve
        y = y.unsqueeze(2).expand(B, H, heads // H, *y.shape[2:]).reshape(B, heads, *y.shape[2:])
    return y.reshape(B * heads, -1, b, d)


def _from_buckets(y: torch.Tensor, order: torch.Tensor, inverse: torch.Tensor, heads: int, n: int) -> torch.Tensor:
    """The inverse of ``_to_buckets`` for an output (B * heads, nb, b, d), which may be a strided view (CUDA's
    flash kernel returns one): (B, heads, n, d) in token order."""
    d = y.shape[-1]
    return permute_tokens(y.reshape(order.shape[0], heads, -1, d), inverse, order.clamp(max=n - 1), n)


def bucketed_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int, perm: torch.Tensor, *,
                       scale: float) -> torch.Tensor:
    """Bucketed SA, q (B, Hq, n, d), k, v (B, Hkv, n, d), ``perm`` σ's gather index (n,) or (B, n): every bucket
    of every head one sequence of ``scaled_dot_product_attention`` with its causal mask."""
    B, Hq, n, _ = q.shape
    b = bucket_size(window)
    order, index, inverse = _plan(perm, B, b)
    qb, kb, vb = (_to_buckets(t, index, inverse, b, Hq) for t in (q, k, v))
    y = F.scaled_dot_product_attention(qb, kb, vb, is_causal=True, scale=scale)
    if checking_finite():  # the CPU kernel gives a NaN query of a short sequence 0, not NaN: say it (debug mode)
        y = y + qb.sum(-1, keepdim=True) * 0
    return _from_buckets(y, order, inverse, Hq, n)


def bucketed_attention_lse(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int, perm: torch.Tensor, *,
                           scale: float, skip_recent: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(output, log-sum-exp (B, Hq, n)) of bucketed SA, for merging with other key sets (sinks, SWA's window in
    the union). ``skip_recent`` > 0 leaves out the keys at distance below it (those SWA's window holds), so a
    union counts no key twice; a query left with no key has log-sum-exp -inf and output 0."""
    B, Hq, n, _ = q.shape
    b = bucket_size(window)
    order, index, inverse = _plan(perm, B, b)
    qb, kb, vb = (_to_buckets(t, index, inverse, b, Hq) for t in (q, k, v))  # (B * Hq, nb, b, d)
    pos = order.view(B, 1, -1, b)  # each bucket's positions, ascending (the spare n last), shared by the heads
    mask = (pos.unsqueeze(-1) >= pos.unsqueeze(-2)) & (pos.unsqueeze(-2) < n)  # causal; the spare never read
    if skip_recent:
        mask = mask & (pos.unsqueeze(-1) - pos.unsqueeze(-2) >= skip_recent)
    mask = mask.expand(B, Hq, -1, b, b).reshape(B * Hq, -1, b, b)
    y, lse = dense_masked_attention(qb, kb, vb, mask, scale=scale, return_lse=True)
    return _from_buckets(y, order, inverse, Hq, n), _from_buckets(lse.unsqueeze(-1), order, inverse, Hq, n)[..., 0]
