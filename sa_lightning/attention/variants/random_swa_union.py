"""Training-free random+SWA: one softmax over the random keys and SWA's window (the control beside
``sa_swa_union``). The window and the random keys beyond it are computed apart and merged by log-sum-exp, so
no key counts twice."""
from __future__ import annotations

import torch

from .. import masks, oracle
from ..banded import banded_attention
from ..dense import dense_masked_attention, merge_partials
from ..flex import keys_flex
from ..random_keys import budget, check_keys, draw_keys, random_attention
from ..registry import Variant, register_variant
from ..sinks import causal_keys
from ._common import dense_for_keys, dense_with_lse, key_table


def mask(spec, n, table, lengths=None):
    return masks.union(masks.random_keys(table), masks.sliding_window(spec.window))


def _dense(call, table) -> bool:
    """The n x n path: a row under two windows, or the random variant's route for the table's keys (the window's
    band costs little beside them)."""
    return call.q.shape[2] < 2 * call.window or dense_for_keys(call, table)


def kernel_with_lse(call):
    return _with_lse(call, key_table(call))


def _with_lse(call, table):
    q, w = call.q, call.window
    if _dense(call, table):
        return dense_with_lse(call, mask(call.spec, q.shape[2], table, call.lengths))
    y_swa, lse_swa = banded_attention(q, call.k, call.v, before=w - 1, after=0, scale=call.scale, return_lse=True)
    y_far, lse_far = random_attention(q, call.k, call.v, table, scale=call.scale, skip_recent=w, validate=False)
    return merge_partials(y_swa, lse_swa, y_far, lse_far)


def kernel(call):
    q = call.q
    table = key_table(call)
    if call.backend == "flex":  # one FlexAttention call over the union's mask (CUDA's route)
        return (keys_flex(q, call.k, call.v, table, scale=call.scale, window=call.window),)
    if _dense(call, table):
        full = masks.dense(mask(call.spec, q.shape[2], table), q.shape[2], batch=q.shape[0], device=q.device)
        return (dense_masked_attention(q, call.k, call.v, full, scale=call.scale),)
    return (_with_lse(call, table)[0],)


def keys_attended_row(spec, length, row):
    """SWA's window, plus the table's keys at distance >= w."""
    i = torch.arange(length, device=row.device).view(-1, 1)
    far = (row[:length] >= 0) & (i - row[:length] >= spec.window)
    return causal_keys(length, spec.window) + int(far.sum())


RANDOM_SWA_UNION = register_variant(Variant(
    name="random_swa_union", label="Random+SWA", color="#0E6655", marker="P", paths=("random_swa_union",),
    kernel=kernel, kernel_with_lse=kernel_with_lse, backends=("banded", "flex", "dense"), mask=mask,
    cpu_graph=False,  # its flex mask is a buffer the graph computes: Inductor's CPU template cannot capture it
    oracle_mask=lambda spec, q, k, table, lengths: oracle.random_swa_union_mask(table, spec.window, q.shape[0],
                                                                               lengths),
    keys_attended_row=keys_attended_row,
    keys_computed_at=lambda spec, n: min(spec.window, n) + min(budget(spec.window), n),
    draw=draw_keys, check_draw=check_keys, draw_ndim=2, windowed=True, min_window=3,
    description="control, training-free: the random keys and SWA's window in one softmax",
))
