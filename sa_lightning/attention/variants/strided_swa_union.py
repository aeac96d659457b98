"""Training-free strided+SWA: one softmax over the strided pattern and SWA's window (the control beside
``sa_swa_union``). The window and the strided keys beyond it are computed apart and merged by log-sum-exp, so no
key counts twice."""
from __future__ import annotations

import torch

from .. import masks, oracle
from ..registry import Variant
from ..sinks import causal_keys
from ..strided import stride, strided_attention
from ._common import union_with_swa


def mask(spec, n, perm=None, lengths=None):
    return masks.union(masks.strided(spec.window, n, lengths), masks.sliding_window(spec.window))


def far_with_lse(call):
    """The strided keys at distance >= w, with their log-sum-exp."""
    return strided_attention(call.q, call.k, call.v, call.window, scale=call.scale, lengths=call.lengths,
                             skip_recent=call.window, validate=False)  # checked by the call


kernel_with_lse = union_with_swa(mask, far_with_lse)


def keys_attended_row(spec, length, row=None):
    """SWA's window, plus the strided keys at distance >= w: multiples of s in [w, i] for query i."""
    s, w = stride(length, spec.window), spec.window
    i = torch.arange(length)
    far = torch.clamp(i // s - (-(-w // s)) + 1, min=0)
    return causal_keys(length, w) + int(far.sum())


VARIANT = STRIDED_SWA_UNION = Variant(
    name="strided_swa_union", label="Strided+SWA", color="#5B2C6F", marker="h", paths=("strided_swa_union",),
    kernel_with_lse=kernel_with_lse, backends=("banded", "dense"), mask=mask,
    oracle_mask=lambda spec, q, k, perm, lengths: oracle.strided_swa_union_mask(q.shape[2], spec.window, q.shape[0],
                                                                               lengths, q.device),
    keys_attended_row=keys_attended_row,
    keys_computed_at=lambda spec, n: min(spec.window, n) + -(-n // stride(n, spec.window)),
    windowed=True, min_window=3,
    description="control, training-free: the strided pattern and SWA's window in one softmax",
)
