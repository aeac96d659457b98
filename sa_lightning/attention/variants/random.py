"""The random-keys control: query i reads itself and each earlier key j < i independently with probability
p = (2 * ceil(w/2) - 2) / (n - 1), SA's exact connection probability for the row's n valid tokens. SA's expected
degree at every position, with independent edges instead of a permutation's: SA against it asks whether the
permutation matters, or only that about w/2 random keys are read (BigBird's random keys, at SA's budget). Its
draw is one hash seed per row and layer (``attention.random_keys``), made as σ is."""
from __future__ import annotations

from .. import masks, oracle
from ..dense import dense_masked_attention
from ..flex import keys_flex
from ..random_keys import budget, check_keys, draw_keys, key_table, random_attention
from ..registry import Variant
from ._common import dense_for_keys


def mask(spec, n, seeds, lengths=None):
    return masks.random_keys(seeds, spec.window, n, lengths)


def _dense_mask(call, seeds):
    n = call.q.shape[2]
    return masks.dense(mask(call.spec, n, seeds, call.lengths), n, batch=call.q.shape[0], device=call.q.device)


def _gathered(call, seeds):
    table = key_table(seeds, call.q.shape[2], call.spec.window, call.lengths)
    return random_attention(call.q, call.k, call.v, table, scale=call.scale, validate=False)


def kernel_with_lse(call):
    seeds = call.perm  # the row's hash seeds (``Call.perm``)
    if dense_for_keys(call):
        return dense_masked_attention(call.q, call.k, call.v, _dense_mask(call, seeds), scale=call.scale,
                                      return_lse=True)
    return _gathered(call, seeds)


def kernel(call):
    seeds = call.perm
    if call.backend == "flex":  # CUDA's route: the hash tile by tile, no table and nothing n x n in memory
        return (keys_flex(call.q, call.k, call.v, seeds, call.spec.window, lengths=call.lengths,
                          scale=call.scale),)
    if dense_for_keys(call):
        return (dense_masked_attention(call.q, call.k, call.v, _dense_mask(call, seeds), scale=call.scale),)
    return (_gathered(call, seeds)[0],)


def keys_attended_row(spec, length, row):
    """Itself, and the hash's keys of each valid query (``row``: the row's seed)."""
    return length + int((key_table(row.view(1), length, spec.window) >= 0).sum())


VARIANT = RANDOM = Variant(
    name="random", label="Random", color="#16A085", marker="X", paths=("random",),
    kernel=kernel, kernel_with_lse=kernel_with_lse, backends=("banded", "flex", "dense"), mask=mask,
    cpu_graph=False,  # its flex mask hashes with thresholds the graph computes (untried in Inductor's CPU template)
    oracle_mask=lambda spec, q, k, seeds, lengths: oracle.random_mask(seeds, spec.window, q.shape[0], q.shape[2],
                                                                      lengths),
    keys_attended_row=keys_attended_row,
    keys_computed_at=lambda spec, n: min(budget(spec.window) + 1, n),  # about the table's width, plus itself
    draw=draw_keys, check_draw=check_keys, draw_ndim=0, windowed=True, min_window=3,
    fused_below=72.0,  # measured: docs/benchmarks/training.md
    description="control: each earlier key independently at SA's connection probability",
)
