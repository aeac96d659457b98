"""Mixture of Block Attention: each query reads its own block (causally) and the top_k - 1 strictly-past
blocks whose mean key scores highest against it. The mask depends on the data, so there is no mask builder."""
from __future__ import annotations

import torch

from .. import masks, oracle
from ..dense import dense_masked_attention
from ..moba import moba_kernel, moba_selection, picks_per_head
from ..registry import Variant


def select(call):
    """The blocks the gate picks (a NaN gate never selects): fixed from the inputs as given where keys are
    non-finite, so that the non-finite guard's runs read the same blocks."""
    return moba_selection(call.q, call.k, call.spec.block_size, call.spec.top_k)


def kernel(call):
    """Own block (causal) plus the top_k - 1 best strictly-past blocks: FlexAttention, the O(n*c) gather kernel
    (``banded``), or the n x n mask of the selection (``dense``)."""
    q, k, v, c, top_k = call.q, call.k, call.v, call.spec.block_size, call.spec.top_k
    if call.backend == "dense":
        selection = call.selection if call.selection is not None else select(call)
        picks = picks_per_head(selection, q)
        n = q.shape[2]
        mask = masks.dense(masks.moba_picks(picks, c), n, batch=q.shape[0], heads=q.shape[1], device=q.device)
        return (dense_masked_attention(q, k, v, mask, scale=call.scale),)
    return (moba_kernel(q, k, v, block_size=c, top_k=top_k, scale=call.scale, selection=call.selection,
                        backend="flex" if call.backend == "flex" else "gather"),)


def keys_attended_row(spec, length, row):
    """Own block plus top_k - 1 past blocks, whichever the gate picks (the count does not depend on it)."""
    c, top_k = spec.block_size, spec.top_k
    tok = torch.arange(length)
    return int((tok % c + 1 + c * torch.clamp(tok // c, max=top_k - 1)).sum())


VARIANT = MOBA = Variant(
    name="moba", label="MoBA", color="#F39C12", marker="v", paths=("moba",),
    kernel=kernel, backends=("banded", "flex", "dense"), cpu_graph=False,
    oracle_mask=lambda spec, q, k, perm, lengths: oracle.moba_mask(q, k, spec.block_size, spec.top_k),
    keys_attended_row=keys_attended_row, select=select,
    keys_computed_at=lambda spec, n: min(n / 2, spec.block_size * spec.top_k),
    blocked=True,
    description="mixture of block attention: own block plus the top-k scoring past blocks",
)
