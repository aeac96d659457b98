"""Mixture of Block Attention (MoBA) without an n x n mask.

Query i always reads its own block causally, and also the (top_k - 1) strictly-past blocks whose
mean key scores highest against it (per head). The two parts are computed separately and merged by
log-sum-exp, so the cost is O(n*c) for the own block, O(n*(k-1)*c) for the selected blocks and
O(n*n/c) for the gate.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from .banded import _fold_groups, _softmax_dtype, _unfold_groups

# Elements of gathered keys one chunk of queries may hold (about 64 MiB in fp32).
_CHUNK_ELEMENTS = 1 << 24


def _own_block(q, k, v, c: int, nblk: int, scale: float):
    """Causal attention inside each block: returns (out, lse), out (B, Hq, n, d), lse (B, Hq, n, 1)."""
    B, Hq, n, d = q.shape
    Hkv = k.shape[1]
    G = Hq // Hkv
    pad = nblk * c - n
    qb = _fold_groups(F.pad(q * scale, (0, 0, 0, pad)), Hkv, nblk, c)  # (B, Hkv, nblk, G*c, d)
    kb = F.pad(k, (0, 0, 0, pad)).view(B, Hkv, nblk, c, d)
    vb = F.pad(v, (0, 0, 0, pad)).view(B, Hkv, nblk, c, d)
    scores = torch.matmul(qb, kb.transpose(-1, -2)).to(_softmax_dtype(q.dtype))
    causal = torch.ones(c, c, dtype=torch.bool, device=q.device).tril()
    scores = scores.view(B, Hkv, nblk, G, c, c).masked_fill(~causal, torch.finfo(scores.dtype).min)
    lse = torch.logsumexp(scores, dim=-1, keepdim=True)
    probs = torch.exp(scores - lse).to(v.dtype).view(B, Hkv, nblk, G * c, c)
    out = _unfold_groups(torch.matmul(probs, vb), Hq, n)
    lse = _unfold_groups(lse.view(B, Hkv, nblk, G * c, 1), Hq, n)
    return out, lse


@torch.no_grad()
def select_blocks(q, k, c: int, picks: int):
    """Per query and head, the ``picks`` strictly-past blocks with the highest q . mean(k_block).

    Returns (index, valid), both (B, Hkv, G*n, picks): queries with fewer past blocks get
    ``valid=False`` in the spare places.
    """
    B, Hq, n, d = q.shape
    Hkv = k.shape[1]
    full = n // c  # only complete blocks can be past blocks of anyone
    means = k[:, :, : full * c].reshape(B, Hkv, full, c, d).float().mean(3)
    gate = torch.matmul(q.reshape(B, Hkv, -1, d).float(), means.transpose(-1, -2))  # (B, Hkv, G*n, full)
    own = (torch.arange(n, device=q.device) // c).repeat(Hq // Hkv)
    past = torch.arange(full, device=q.device).view(1, -1) < own.view(-1, 1)
    gate = gate.masked_fill(~past, float("-inf"))
    if full < picks:
        gate = F.pad(gate, (0, picks - full), value=float("-inf"))
    vals, index = gate.topk(picks, dim=-1)
    return index.clamp_(max=max(full - 1, 0)), vals > float("-inf")


def _selected_chunk(q, kb_flat, vb_flat, flat_index, valid):
    """Attention of a chunk of queries to their selected blocks: returns (out, lse).

    q (B, Hkv, Qc, d) pre-scaled; flat_index/valid (B, Hkv, Qc, T); kb_flat/vb_flat (B*Hkv*nblk, c, d).
    """
    kg, vg = kb_flat[flat_index], vb_flat[flat_index]  # (B, Hkv, Qc, T, c, d)
    scores = torch.einsum("bhqd,bhqtcd->bhqtc", q, kg).to(_softmax_dtype(q.dtype))
    scores = scores.masked_fill(~valid.unsqueeze(-1), torch.finfo(scores.dtype).min)
    flat = scores.flatten(-2)
    lse = torch.logsumexp(flat, dim=-1, keepdim=True)
    probs = torch.exp(flat - lse).to(vg.dtype).view_as(scores)
    return torch.einsum("bhqtc,bhqtcd->bhqd", probs, vg), lse


def _selected_blocks(q, k, v, index, valid, c: int, scale: float):
    B, Hq, n, d = q.shape
    Hkv = k.shape[1]
    picks = index.shape[-1]
    full = n // c
    kb_flat = k[:, :, : full * c].reshape(B * Hkv * full, c, d)
    vb_flat = v[:, :, : full * c].reshape(B * Hkv * full, c, d)
    base = (torch.arange(B * Hkv, device=q.device) * full).view(B, Hkv, 1, 1)
    flat_index = index + base
    qg = (q * scale).reshape(B, Hkv, -1, d)
    total = qg.shape[2]
    chunk = max(1, _CHUNK_ELEMENTS // max(1, B * Hkv * picks * c * d))
    outs, lses = [], []
    for start in range(0, total, chunk):
        sl = slice(start, start + chunk)
        args = (qg[:, :, sl], kb_flat, vb_flat, flat_index[:, :, sl], valid[:, :, sl])
        if torch.is_grad_enabled() and total > chunk:
            # Recompute the gathered keys in backward instead of keeping n*(k-1)*c*d of them.
            o, lse = checkpoint(_selected_chunk, *args, use_reentrant=False)
        else:
            o, lse = _selected_chunk(*args)
        outs.append(o)
        lses.append(lse)
    out = torch.cat(outs, 2).view(B, Hq, n, d)
    lse = torch.cat(lses, 2).view(B, Hq, n, 1)
    return out, lse


def moba_kernel(q, k, v, *, block_size: int, top_k: int, scale: float) -> torch.Tensor:
    """MoBA with block size c and top_k blocks per query (its own block counts as one)."""
    n = q.shape[2]
    c = block_size
    nblk = -(-n // c)
    out_own, lse_own = _own_block(q, k, v, c, nblk, scale)
    picks = min(top_k - 1, nblk - 1)
    if picks <= 0 or n // c == 0:
        return out_own
    index, valid = select_blocks(q, k, c, picks)
    out_sel, lse_sel = _selected_blocks(q, k, v, index, valid, c, scale)
    lse = torch.logaddexp(lse_own, lse_sel)
    out = out_own * torch.exp(lse_own - lse).to(q.dtype) + out_sel * torch.exp(lse_sel - lse).to(q.dtype)
    return out
