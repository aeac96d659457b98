"""Training-free random+SWA: one softmax over the random keys and SWA's window (the control beside
``sa_swa_union``). The window and the random keys beyond it are computed apart and merged by log-sum-exp, so
no key counts twice."""
from __future__ import annotations

import torch

from .. import masks, oracle
from ..flex import keys_flex
from ..random_keys import budget, check_keys, draw_keys, key_table, random_attention
from ..registry import Variant
from ..sinks import causal_keys
from ._common import dense_for_keys, dense_output, union_with_swa


def mask(spec, n, seeds, lengths=None):
    return masks.union(masks.random_keys(seeds, spec.window, n, lengths), masks.sliding_window(spec.window))


def _dense(call) -> bool:
    """The n x n path: a row under two windows, or the random variant's route for its keys (the window's band
    costs little beside them)."""
    return call.q.shape[2] < 2 * call.window or dense_for_keys(call)


def far_with_lse(call):
    """The random keys at distance >= w (``call.perm``: the rows' hash seeds), with their log-sum-exp."""
    table = key_table(call.perm, call.q.shape[2], call.spec.window, call.lengths)
    return random_attention(call.q, call.k, call.v, table, scale=call.scale, skip_recent=call.window, validate=False)


kernel_with_lse = union_with_swa(mask, far_with_lse, dense=_dense)


def kernel(call):
    if call.backend == "flex":  # one FlexAttention call over the union's mask (CUDA's route)
        return (keys_flex(call.q, call.k, call.v, call.perm, call.spec.window, lengths=call.lengths, scale=call.scale,
                          window=call.window),)
    if _dense(call):
        return (dense_output(call, mask(call.spec, call.q.shape[2], call.perm, call.lengths)),)
    return (kernel_with_lse(call)[0],)


def keys_attended_row(spec, length, row):
    """SWA's window, plus the hash's keys at distance >= w (``row``: the row's seed)."""
    table = key_table(row.view(1), length, spec.window)[0]
    i = torch.arange(length, device=row.device).view(-1, 1)
    far = (table >= 0) & (i - table >= spec.window)
    return causal_keys(length, spec.window) + int(far.sum())


VARIANT = RANDOM_SWA_UNION = Variant(
    name="random_swa_union", label="Random+SWA", color="#0E6655", marker="P", paths=("random_swa_union",),
    kernel=kernel, kernel_with_lse=kernel_with_lse, backends=("banded", "flex", "dense"), mask=mask,
    cpu_graph=False,  # its flex mask hashes with thresholds the graph computes (untried in Inductor's CPU template)
    oracle_mask=lambda spec, q, k, seeds, lengths: oracle.random_swa_union_mask(seeds, spec.window, q.shape[0],
                                                                               q.shape[2], lengths),
    keys_attended_row=keys_attended_row,
    keys_computed_at=lambda spec, n: min(spec.window, n) + min(budget(spec.window), n),
    draw=draw_keys, check_draw=check_keys, draw_ndim=0, windowed=True, min_window=3,
    description="control, training-free: the random keys and SWA's window in one softmax",
)
