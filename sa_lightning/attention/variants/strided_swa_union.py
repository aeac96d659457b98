"""Training-free strided+SWA: one softmax over the strided pattern and SWA's window (the control beside
``sa_swa_union``). The window and the strided keys beyond it are computed apart and merged by log-sum-exp, so no
key counts twice."""
from __future__ import annotations

import torch

from .. import masks, oracle
from ..banded import banded_attention
from ..dense import merge_partials
from ..registry import Variant, register_variant
from ..sinks import causal_keys
from ..strided import stride, strided_attention
from ._common import dense_with_lse


def mask(spec, n, perm=None, lengths=None):
    return masks.union(masks.strided(spec.window, n, lengths), masks.sliding_window(spec.window))


def kernel_with_lse(call):
    q, w = call.q, call.window
    if call.backend == "dense" or q.shape[2] < 2 * w:
        return dense_with_lse(call, mask(call.spec, q.shape[2], None, call.lengths))
    y_swa, lse_swa = banded_attention(q, call.k, call.v, before=w - 1, after=0, scale=call.scale, return_lse=True)
    y_far, lse_far = strided_attention(q, call.k, call.v, w, scale=call.scale, lengths=call.lengths, skip_recent=w,
                                       validate=call.validate)
    return merge_partials(y_swa, lse_swa, y_far, lse_far)


def kernel(call):
    return (kernel_with_lse(call)[0],)


def keys_attended_row(spec, length, row=None):
    """SWA's window, plus the strided keys at distance >= w: multiples of s in [w, i] for query i."""
    s, w = stride(length, spec.window), spec.window
    i = torch.arange(length)
    far = torch.clamp(i // s - (-(-w // s)) + 1, min=0)
    return causal_keys(length, w) + int(far.sum())


STRIDED_SWA_UNION = register_variant(Variant(
    name="strided_swa_union", label="Strided+SWA", color="#5B2C6F", marker="h", paths=("strided_swa_union",),
    kernel=kernel, kernel_with_lse=kernel_with_lse, backends=("banded", "dense"), mask=mask,
    oracle_mask=lambda spec, q, k, perm, lengths: oracle.strided_swa_union_mask(q.shape[2], spec.window, q.shape[0],
                                                                               lengths, q.device),
    keys_attended_row=keys_attended_row,
    keys_computed_at=lambda spec, n: min(spec.window, n) + -(-n // stride(n, spec.window)),
    windowed=True, min_window=3,
    description="control, training-free: the strided pattern and SWA's window in one softmax",
))
