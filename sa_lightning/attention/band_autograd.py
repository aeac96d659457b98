"""The differentiable band path with log-sum-exp: every block's key window gathered, then plain autograd ops.

``banded_attention`` takes it when a caller asks for each query's log-sum-exp (the union of SA and SWA, and
sinks, merge disjoint key sets by it) or drops the recent keys (``skip_recent``), unless the forward-only
path (``band_fused``) applies. It copies the windows, so plain training runs the in-place kernel
(``band_inplace``) instead.
"""
from __future__ import annotations

import torch

from .band_common import fold_groups, mask_bias, softmax_dtype, take_rows, unfold_groups


def autograd_window_attention(q, k, v, q_src, k_src, blocked, scale, blk, W):
    """The differentiable path with log-sum-exp (the union's two key sets): every block's key window gathered
    contiguously, then plain autograd ops. Returns out (B, Hq, nb*blk, d) and lse (B, Hq, nb*blk)."""
    B, Hq, _, d = q.shape
    Hkv = k.shape[1]
    G = Hq // Hkv
    nb = blocked.shape[1]
    dev = q.device
    # One gather lays out every block's key window contiguously: (B*Hkv*nb, W, d), no unfold copy.
    cols = (torch.arange(nb, device=dev) * blk).view(nb, 1) + torch.arange(W, device=dev).view(1, W)
    w_src = k_src[:, cols.flatten()]

    def windows(x: torch.Tensor) -> torch.Tensor:
        return take_rows(x, w_src).view(B * Hkv * nb, W, d)

    qb = fold_groups(take_rows(q, q_src).mul_(scale), Hkv, nb, blk).reshape(B * Hkv * nb, G * blk, d)
    out, lse = _softmax_with_lse(qb, windows(k), windows(v), blocked.view(-1, 1, nb, 1, blk, W),
                                 (B, Hkv, nb, G, blk, W))
    lse = unfold_groups(lse.view(B, Hkv, nb, G * blk, 1), Hq, nb * blk).squeeze(-1)
    return unfold_groups(out.view(B, Hkv, nb, G * blk, d), Hq, nb * blk), lse


def _softmax_with_lse(q, k, v, blocked, score_view):
    """softmax(q k^T, masked) v over (query block, key window) pairs, plus the scores' log-sum-exp."""
    sdt = softmax_dtype(q.dtype)
    scores = torch.bmm(q, k.transpose(1, 2)).to(sdt)
    scores = (scores.view(score_view) + mask_bias(blocked, sdt)).view(scores.shape)  # finite k, v (mask_bias)
    lse = torch.logsumexp(scores, dim=-1, keepdim=True)
    out = torch.bmm(torch.exp(scores - lse).to(v.dtype), v)
    return out, lse
