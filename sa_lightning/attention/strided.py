"""The strided control: query i reads every earlier key j with (i - j) mod s = 0, where
s = ceil((n - 1) / (2 * ceil(w/2) - 2)) for a row of n valid tokens. Spread evenly over the whole past, it reads
about SA's expected number of keys at every position, with no randomness: the control that tells a random
permutation from a regular long-range pattern.

The kernel folds the row into s interleaved groups (positions r, r + s, r + 2s, ...): inside a group the pattern
is plain causal attention, so one batched matmul per group computes it exactly, O(n * n / s) = O(n * w) work.
It returns its log-sum-exp too, so sinks and the union with SWA merge with it by log-sum-exp.
"""
from __future__ import annotations

import math

import torch

from ._checks import check_lengths
from .masks import sa_band_others


def stride(n: int, window: int) -> int:
    """s for a row of n valid tokens at window w (w >= 3: SA's band then reads at least one other key)."""
    if window < 3:
        raise ValueError(f"the strided pattern needs a window >= 3 (it reads 2*ceil(w/2) - 2 keys), got {window}.")
    return max(1, math.ceil((n - 1) / sa_band_others(window)))


def strides(lengths: torch.Tensor, window: int) -> torch.Tensor:
    """``stride`` of each row, as a tensor (what the masks read)."""
    if window < 3:
        stride(1, window)  # the one sentence
    per = sa_band_others(window)
    return torch.clamp(torch.div(lengths - 1 + per - 1, per, rounding_mode="floor"), min=1)


def _grouped(q, k, v, s: int, scale: float, skip_recent: int):
    """(output, lse) of one stride s over rows whose valid tokens all lie first (any later ones are never read
    by an earlier query: the pattern is causal). ``skip_recent``: leave out keys with i - j < skip_recent."""
    B, Hq, n, d = q.shape
    G = Hq // k.shape[1]
    m = -(-n // s)
    pad = m * s - n

    def fold(t):  # (B, H, n, d) -> (B, H, s, m, d): group r holds positions r, r + s, ...
        t = torch.nn.functional.pad(t, (0, 0, 0, pad))
        return t.view(t.shape[0], t.shape[1], m, s, d).transpose(2, 3)

    qg = fold(q)
    kg, vg = (fold(t).repeat_interleave(G, dim=1) for t in (k, v))
    scores = (qg @ kg.transpose(-1, -2)).float() * scale if q.dtype in (torch.float16, torch.bfloat16) \
        else (qg @ kg.transpose(-1, -2)) * scale
    a = torch.arange(m, device=q.device)
    gap = a.view(-1, 1) - a.view(1, -1)  # in steps of s
    allowed = (gap >= 0) & (gap * s >= skip_recent)
    scores = scores.masked_fill(~allowed, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    empty = torch.isinf(lse)
    probs = torch.exp(scores - torch.where(empty, 0.0, lse).unsqueeze(-1))
    out = (probs.to(vg.dtype) @ vg)  # (B, H, s, m, d)
    out = out.transpose(2, 3).reshape(B, Hq, m * s, d)[:, :, :n]
    lse = lse.transpose(2, 3).reshape(B, Hq, m * s)[:, :, :n]
    return out, lse


def strided_attention(q, k, v, window: int, *, scale: float, lengths: torch.Tensor | None = None,
                      skip_recent: int = 0, validate: bool = True, stride_of=None):
    """(output, log-sum-exp) of the strided pattern; ``lengths`` (B,): each row its own stride (a padded batch:
    row b's valid tokens first). Rows of one length run together; outputs at padding tokens are 0.
    ``stride_of(length)``: another rule for s (the local-band control's); ``stride`` by default."""
    stride_of = stride_of or (lambda length: stride(length, window))
    return by_length(q, k, v, lengths, validate,
                     lambda q_, k_, v_: _grouped(q_, k_, v_, stride_of(q_.shape[2]), scale, skip_recent))


def by_length(q, k, v, lengths: torch.Tensor | None, validate: bool, run):
    """(output, log-sum-exp) of ``run(q, k, v)`` over rows whose valid tokens all lie first: the whole batch without
    ``lengths``, else the rows of each length together, cut to it; outputs at padding tokens are 0."""
    B, _, n, _ = q.shape
    lengths = check_lengths(lengths, B, n, q.device, values=validate)
    if lengths is None:
        return run(q, k, v)
    out = torch.zeros_like(q)
    lse = torch.full(q.shape[:3], float("-inf"), dtype=torch.promote_types(q.dtype, torch.float32), device=q.device)
    for length in sorted(set(lengths.tolist())):  # a host read: padded batches are inference's, not training's
        rows = (lengths == length).nonzero().squeeze(1)
        y, l = run(q[rows, :, :length], k[rows, :, :length], v[rows, :, :length])
        out[rows, :, :length] = y
        lse[rows, :, :length] = l.to(lse.dtype)
    return out, lse
