"""Full causal attention: every query reads every earlier key. One kernel on every backend: PyTorch's fused
causal SDPA (which is what ``dense`` would compute, without the n x n mask)."""
from __future__ import annotations

import torch.nn.functional as F

from .. import masks, oracle
from ..registry import Variant
from ..sinks import causal_keys


def kernel(call):
    return (F.scaled_dot_product_attention(call.q, call.k, call.v, is_causal=True, scale=call.scale,
                                           enable_gqa=call.q.shape[1] != call.k.shape[1]),)


VARIANT = FULL = Variant(
    name="full", label="Full", color="#7F7F7F", marker="s", paths=("full",),
    kernel=kernel, backends=("banded", "flex", "dense"), sparse=False,
    mask=lambda spec, n, perm=None, lengths=None: masks.causal,
    oracle_mask=lambda spec, q, k, perm, lengths: oracle.full_mask(q.shape[2], q.device),
    keys_attended_row=lambda spec, length, row: causal_keys(length),
    keys_computed_at=lambda spec, n: n / 2,  # a fused causal kernel skips the blocks above the diagonal
    fused_below=None,  # its own kernel is the fused one
    description="causal attention over all previous tokens", title="Full Attention",
)
