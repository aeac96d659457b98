"""Mixture of Block Attention: each query reads its own block (causally) and the top_k - 1 strictly-past
blocks whose mean key scores highest against it. The mask depends on the data, so there is no mask builder."""
from __future__ import annotations

import torch

from .. import oracle
from ..functional import moba_attention
from ..registry import Variant, register_variant


def kernel(call):
    spec = call.spec
    return (moba_attention(call.q, call.k, call.v, spec.block_size, spec.top_k, scale=call.scale,
                           backend=call.backend),)


def keys_attended_row(spec, length, row):
    """Own block plus top_k - 1 past blocks, whichever the gate picks (the count does not depend on it)."""
    c, top_k = spec.block_size, spec.top_k
    tok = torch.arange(length)
    return int((tok % c + 1 + c * torch.clamp(tok // c, max=top_k - 1)).sum())


MOBA = register_variant(Variant(
    name="moba", label="MoBA", color="#F39C12", marker="v", paths=("moba",),
    kernel=kernel, backends=("banded", "flex", "dense"), cpu_graph=False,
    oracle_mask=lambda spec, q, k, perm, lengths: oracle.moba_mask(q, k, spec.block_size, spec.top_k),
    keys_attended_row=keys_attended_row,
    keys_computed_at=lambda spec, n: min(n / 2, spec.block_size * spec.top_k),
    blocked=True,
    description="mixture of block attention: own block plus the top-k scoring past blocks",
))
