"""The random-keys control: query i reads itself and each earlier key j < i independently with probability
p = (2 * ceil(w/2) - 2) / (n - 1), SA's exact connection probability for the row's n valid tokens. SA's expected
degree at every position, with independent edges instead of a permutation's: SA against it asks whether the
permutation matters, or only that about w/2 random keys are read (BigBird's random keys, at SA's budget). Its
draw is a key table per layer (``attention.random_keys``), made as σ is."""
from __future__ import annotations

from .. import masks, oracle
from ..dense import dense_masked_attention
from ..flex import keys_flex
from ..random_keys import budget, check_keys, draw_keys, random_attention
from ..registry import Variant, register_variant
from ._common import dense_for_keys, key_table


def mask(spec, n, table, lengths=None):
    return masks.random_keys(table)


def _dense_mask(call, table):
    return masks.dense(mask(call.spec, call.q.shape[2], table), call.q.shape[2], batch=call.q.shape[0],
                       device=call.q.device)


def kernel_with_lse(call):
    table = key_table(call)
    if dense_for_keys(call, table):
        return dense_masked_attention(call.q, call.k, call.v, _dense_mask(call, table), scale=call.scale,
                                      return_lse=True)
    return random_attention(call.q, call.k, call.v, table, scale=call.scale, validate=False)


def kernel(call):
    table = key_table(call)
    if call.backend == "flex":  # CUDA's route: a training step of the gather keeps n * K * d per head (OOM)
        return (keys_flex(call.q, call.k, call.v, table, scale=call.scale),)
    if dense_for_keys(call, table):
        return (dense_masked_attention(call.q, call.k, call.v, _dense_mask(call, table), scale=call.scale),)
    return (random_attention(call.q, call.k, call.v, table, scale=call.scale, validate=False)[0],)


def keys_attended_row(spec, length, row):
    """Itself, and the table's keys of each valid query."""
    return length + int((row[:length] >= 0).sum())


RANDOM = register_variant(Variant(
    name="random", label="Random", color="#16A085", marker="X", paths=("random",),
    kernel=kernel, kernel_with_lse=kernel_with_lse, backends=("banded", "flex", "dense"), mask=mask,
    cpu_graph=False,  # its flex mask is a buffer the graph computes: Inductor's CPU template cannot capture it
    oracle_mask=lambda spec, q, k, table, lengths: oracle.random_mask(table, q.shape[0], lengths),
    keys_attended_row=keys_attended_row,
    keys_computed_at=lambda spec, n: min(budget(spec.window) + 1, n),  # about the table's width, plus itself
    draw=draw_keys, check_draw=check_keys, draw_ndim=2, windowed=True, min_window=3,
    description="control: each earlier key independently at SA's connection probability",
))
