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

from .band_common import fold_groups, fused_forward_applies, sdpa_lse, softmax_dtype, unfold_groups

# Elements of gathered keys one chunk of queries may hold (about 64 MiB in fp32).
_CHUNK_ELEMENTS = 1 << 24


def _own_block(q, k, v, c: int, nblk: int, scale: float):
    """Causal attention inside each block: returns (out, lse), out (B, Hq, n, d), lse (B, Hq, n, 1)."""
    B, Hq, n, d = q.shape
    Hkv = k.shape[1]
    G = Hq // Hkv
    pad = nblk * c - n
    qb = fold_groups(F.pad(q * scale, (0, 0, 0, pad)), Hkv, nblk, c)  # (B, Hkv, nblk, G*c, d)
    kb = F.pad(k, (0, 0, 0, pad)).view(B, Hkv, nblk, c, d)
    vb = F.pad(v, (0, 0, 0, pad)).view(B, Hkv, nblk, c, d)
    scores = torch.matmul(qb, kb.transpose(-1, -2)).to(softmax_dtype(q.dtype))
    causal = torch.ones(c, c, dtype=torch.bool, device=q.device).tril()
    scores = scores.view(B, Hkv, nblk, G, c, c).masked_fill(~causal, torch.finfo(scores.dtype).min)
    lse = torch.logsumexp(scores, dim=-1, keepdim=True)
    probs = torch.exp(scores - lse).to(v.dtype).view(B, Hkv, nblk, G * c, c)
    out = unfold_groups(torch.matmul(probs, vb), Hq, n)
    lse = unfold_groups(lse.view(B, Hkv, nblk, G * c, 1), Hq, n)
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
    gdt = softmax_dtype(q.dtype)  # half inputs gate in fp32; float64 keeps its precision near ties
    means = k[:, :, : full * c].reshape(B, Hkv, full, c, d).to(gdt).mean(3)
    gate = torch.matmul(q.reshape(B, Hkv, -1, d).to(gdt), means.transpose(-1, -2))  # (B, Hkv, G*n, full)
    own = (torch.arange(n, device=q.device) // c).repeat(Hq // Hkv)
    past = torch.arange(full, device=q.device).view(1, -1) < own.view(-1, 1)
    # a NaN gate (a non-finite key in the block) selects nothing: topk would rank it first
    gate = gate.masked_fill(~past | gate.isnan(), float("-inf"))
    if full < picks:
        gate = F.pad(gate, (0, picks - full), value=float("-inf"))
    vals, index = gate.topk(picks, dim=-1)
    return index.clamp_(max=max(full - 1, 0)), vals > float("-inf")


def _selected_chunk(q, kb_flat, vb_flat, flat_index, valid):
    """Attention of a chunk of queries to their selected blocks: returns (out, lse).

    q (B, Hkv, Qc, d) pre-scaled; flat_index/valid (B, Hkv, Qc, T); kb_flat/vb_flat (B*Hkv*nblk, c, d).
    """
    kg, vg = kb_flat[flat_index], vb_flat[flat_index]  # (B, Hkv, Qc, T, c, d)
    scores = torch.einsum("bhqd,bhqtcd->bhqtc", q, kg).to(softmax_dtype(q.dtype))
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


#: Queries per tile in the forward-only path: each tile reads one selected block.
_TILE = 32


def _own_block_fused(q, k, v, c: int, nblk: int, scale: float):
    """Forward only: causal attention inside each block, one fused call per batch row with the blocks
    as the batch. Returns (out, lse) shaped as ``_own_block``'s: (B, Hq, n, d) and (B, Hq, n, 1)."""
    B, Hq, n, d = q.shape
    Hkv = k.shape[1]
    pad = nblk * c - n  # padded keys sit after every real query, so the causal test never reads them
    qp, kp, vp = (F.pad(t, (0, 0, 0, pad)) for t in (q, k, v))
    outs, lses = [], []
    for b in range(B):
        o, lse = sdpa_lse(qp[b].view(Hq, nblk, c, d).transpose(0, 1), kp[b].view(Hkv, nblk, c, d).transpose(0, 1),
                          vp[b].view(Hkv, nblk, c, d).transpose(0, 1), causal=True, scale=scale)
        outs.append(o.transpose(0, 1).reshape(Hq, nblk * c, d)[:, :n])  # (nblk, Hq, c, d) -> (Hq, n, d)
        lses.append(lse.transpose(0, 1).reshape(Hq, nblk * c)[:, :n])
    return torch.stack(outs), torch.stack(lses).unsqueeze(-1)


def _selected_fused(q, k, v, index, valid, c: int, scale: float):
    """Forward only: attention of each (query, head) to its selected past blocks, grouped by block.

    The valid (query, pick) pairs are sorted by the kv head and block they read and cut into tiles
    of ``_TILE`` queries that share one block, as varlen attention does on GPU. One fused call then
    runs every tile against its block, so each block's keys are copied once per tile rather than
    once per query. The picks of a query merge by log-sum-exp; returns (out, lse) shaped as
    ``_selected_blocks``'s: (B, Hq, n, d) and (B, Hq, n, 1). As there, a pick that is not valid
    scores ``finfo.min``, so a query with none gets a finite lse that weighs nothing in the merge.
    """
    B, Hq, n, d = q.shape
    Hkv = k.shape[1]
    G = Hq // Hkv
    picks = index.shape[-1]
    full = n // c
    groups = B * Hkv * full
    kb = k[:, :, : full * c].reshape(groups, c, d)
    vb = v[:, :, : full * c].reshape(groups, c, d)
    # Pair p = (query row of the folded (B, Hkv, G*n) layout, pick); the block it reads:
    block = (index + (torch.arange(B * Hkv, device=q.device) * full).view(B, Hkv, 1, 1)).flatten()
    pair = valid.flatten().nonzero().squeeze(1)
    block = block[pair]
    order = torch.argsort(block, stable=True)
    pair, block = pair[order], block[order]
    counts = torch.bincount(block, minlength=groups)
    tiles = -(-counts // _TILE)
    tile_of_group = torch.cumsum(tiles, 0) - tiles
    rank = torch.arange(block.numel(), device=q.device) - (torch.cumsum(counts, 0) - counts)[block]
    where = (tile_of_group[block] + rank // _TILE) * _TILE + rank % _TILE  # the pair's row among the tiles
    num_tiles = int(tiles.sum())
    tile_block = torch.repeat_interleave(torch.arange(groups, device=q.device), tiles)
    qt = q.new_zeros(num_tiles * _TILE, d)
    qt[where] = q.reshape(-1, d)[pair // picks]  # (B, Hq, n) is (B, Hkv, G*n) folded
    o, lse = sdpa_lse(qt.view(num_tiles, 1, _TILE, d), kb[tile_block].unsqueeze(1), vb[tile_block].unsqueeze(1),
                      causal=False, scale=scale)
    rows = B * Hkv * G * n
    out = q.new_zeros(rows * picks, d)
    lse_out = torch.full((rows * picks,), torch.finfo(lse.dtype).min, dtype=lse.dtype, device=q.device)
    out[pair] = o.reshape(-1, d)[where]
    lse_out[pair] = lse.reshape(-1)[where]
    lse_out = lse_out.view(rows, picks)
    lse_q = torch.logsumexp(lse_out, dim=1, keepdim=True)
    out = (torch.exp(lse_out - lse_q).unsqueeze(-1) * out.view(rows, picks, d)).sum(1)
    return out.to(q.dtype).view(B, Hq, n, d), lse_q.view(B, Hq, n, 1)


def moba_selection(q, k, block_size: int, top_k: int):
    """The past blocks each query reads, (index, valid) from ``select_blocks``, or None when there are none."""
    n = q.shape[2]
    picks = min(top_k - 1, -(-n // block_size) - 1)
    if picks <= 0 or n // block_size == 0:
        return None
    return select_blocks(q, k, block_size, picks)


def picks_per_head(selection, q) -> torch.Tensor:
    """``moba_selection``'s (index, valid), folded (B, Hkv, G*n, P), as (B, Hq, n, P) block indices, -1 = none;
    a selection of None (no past blocks: each query reads its own block only) as one -1 per query."""
    B, Hq, n, _ = q.shape
    if selection is None:
        return torch.full((B, Hq, n, 1), -1, dtype=torch.long, device=q.device)
    index, valid = selection
    return torch.where(valid, index, -1).view(B, Hq, n, -1)  # (B, Hkv, G*n) is (B, Hq, n) folded


def moba_kernel(q, k, v, *, block_size: int, top_k: int, scale: float, selection=None,
                backend: str = "gather") -> torch.Tensor:
    """MoBA with block size c and top_k blocks per query (its own block counts as one). ``selection``, from
    ``moba_selection``, fixes the selected blocks (the non-finite guard's runs share the raw inputs' gate).

    ``backend``: ``"flex"`` runs one FlexAttention call over a block mask built from the picks (CUDA's path:
    the gather path below moves n*(k-1)*c*d keys, a Python loop of small chunks on a GPU); ``"gather"``
    gathers each query's selected blocks (autograd), or on CPU without grad runs SDPA's fused kernel."""
    n = q.shape[2]
    c = block_size
    if backend == "flex":
        from .flex import moba_flex

        if selection is None:
            selection = moba_selection(q, k, c, top_k)
        return moba_flex(q, k, v, picks_per_head(selection, q), c, scale=scale)
    # Forward only on CPU, both parts run through SDPA's fused kernel; otherwise the autograd path.
    fused = fused_forward_applies(q, k, v)
    own_block, selected_blocks = (_own_block_fused, _selected_fused) if fused else (_own_block, _selected_blocks)
    nblk = -(-n // c)
    out_own, lse_own = own_block(q, k, v, c, nblk, scale)
    if selection is None:
        selection = moba_selection(q, k, c, top_k)
    if selection is None:
        return out_own
    index, valid = selection
    out_sel, lse_sel = selected_blocks(q, k, v, index, valid, c, scale)
    lse = torch.logaddexp(lse_own, lse_sel)
    out = out_own * torch.exp(lse_own - lse).to(q.dtype) + out_sel * torch.exp(lse_sel - lse).to(q.dtype)
    return out
