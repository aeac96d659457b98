"""Attention with an explicit mask, for short sequences and small key sets, and the merge of two partial
softmaxes by their log-sum-exps.

The ``dense`` backend runs everything through ``dense_masked_attention``; the banded backend uses it for rows
shorter than two windows and for sink keys. ``merge_partials`` joins two disjoint key sets' outputs into one
softmax (SA and SWA in the union, a variant and its sinks).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .band_common import softmax_dtype


def dense_masked_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor,
                           *, scale: float, return_lse: bool = False):
    """Masked softmax attention with an explicit (Bm, Hm, n, m) bool mask (m keys: n for self-attention);
    for short sequences and small key sets only. ``return_lse`` also returns each query's log-sum-exp
    (B, Hq, n), -inf for a query that reads no key (its output is then 0), so partial softmaxes merge."""
    B, Hq, n, d = q.shape
    Hkv, m = k.shape[1], k.shape[2]
    G = Hq // Hkv
    qg = (q * scale).reshape(B, Hkv, G * n, d)  # q may be a transposed view (the model's heads)
    scores = torch.matmul(qg, k.transpose(-1, -2)).to(softmax_dtype(q.dtype)).view(B, Hkv, G, n, m)
    if mask.shape[1] == 1:
        mask = mask.reshape(mask.shape[0], 1, 1, n, m)
    else:
        mask = mask.reshape(mask.shape[0], Hkv, G, n, m)
    if return_lse:
        scores = scores.masked_fill(~mask, float("-inf"))
        lse = torch.logsumexp(scores, dim=-1, keepdim=True)
        probs = torch.exp(scores - torch.where(torch.isinf(lse), 0.0, lse)).to(v.dtype).view(B, Hkv, G * n, m)
        return torch.matmul(probs, v).view(B, Hq, n, d), lse.view(B, Hq, n)
    scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    probs = torch.softmax(scores, dim=-1).to(v.dtype).view(B, Hkv, G * n, m)
    return torch.matmul(probs, v).view(B, Hq, n, d)


def fused_masked_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, *,
                           scale: float) -> torch.Tensor:
    """``dense_masked_attention``'s output through PyTorch's fused SDPA (on the CPU its flash kernel takes the
    mask, tile by tile, with no n x n scores kept for the backward). Every query row of ``mask`` must hold a key:
    a row without one would come out NaN, where the unfused path averages every key (``Variant.fused_route``
    sends only rows that read their own key)."""
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=q.shape[1] != k.shape[1])


def merge_partials(y_a: torch.Tensor, lse_a: torch.Tensor, y_b: torch.Tensor, lse_b: torch.Tensor):
    """One softmax over two disjoint key sets, from each set's output and log-sum-exp (B, Hq, n): returns
    the merged output in y_a's dtype (merged in fp32 for half inputs) and the merged log-sum-exp."""
    acc = torch.promote_types(y_a.dtype, torch.float32)
    top = torch.maximum(lse_a, lse_b).to(acc)
    a, b = torch.exp(lse_a.to(acc) - top).unsqueeze(-1), torch.exp(lse_b.to(acc) - top).unsqueeze(-1)
    y = ((a * y_a.to(acc) + b * y_b.to(acc)) / (a + b)).to(y_a.dtype)
    return y, top + torch.log((a + b).squeeze(-1))
