"""Sliding-window attention: query i reads keys j with 0 <= i - j <= w - 1."""
from __future__ import annotations

from .. import masks, oracle
from ..banded import banded_attention
from ..dense import dense_masked_attention
from ..registry import Variant
from ..sinks import causal_keys
from ._common import swa_with_lse


def attend(call):
    """SWA's output: the O(n*w) band, FlexAttention, or the n x n mask (``dense``, and rows under two windows)."""
    q, k, v, window, scale = call.q, call.k, call.v, call.window, call.scale
    n = q.shape[2]
    if call.backend == "dense" or (call.backend == "banded" and n < 2 * window):
        return dense_masked_attention(q, k, v, masks.dense(masks.sliding_window(window), n, device=q.device),
                                      scale=scale)
    if call.backend == "flex":
        from ..flex import swa_flex

        return swa_flex(q, k, v, window, scale=scale)
    return banded_attention(q, k, v, before=window - 1, after=0, scale=scale)


def kernel(call):
    return (attend(call),)


VARIANT = SWA = Variant(
    name="swa", label="SWA", color="#4A90D9", marker="o", paths=("swa",),
    kernel=kernel, kernel_with_lse=swa_with_lse, backends=("banded", "flex", "dense"),
    mask=lambda spec, n, perm=None, lengths=None: masks.sliding_window(spec.window),
    oracle_mask=lambda spec, q, k, perm, lengths: oracle.swa_mask(q.shape[2], spec.window, q.device),
    keys_attended_row=lambda spec, length, row: causal_keys(length, spec.window),
    keys_computed_at=lambda spec, n: min(spec.window, n),
    windowed=True, local_paths=("swa",),
    description="sliding-window attention over the last w keys",
)


def gated_with_swa(far: Variant, union: Variant, **fields) -> Variant:
    """A gated pair: ``far``'s path and SWA's, mixed by the learned output gates of a model trained with them
    (the controls' counterparts of the paper's gated SA+SWA). It reads the keys of ``union``, its training-free
    twin, and draws what ``far`` draws."""

    def kernel(call):
        return (*far.kernel(call), *SWA.kernel(call))

    backends = tuple(b for b in far.backends if b in SWA.backends)  # both paths run on the backend the call resolves
    return Variant(paths=(far.name, SWA.name), kernel=kernel, backends=backends, mask=union.mask,
                   keys_attended_row=union.keys_attended_row,  # the keys either path reads: the union
                   keys_computed_at=lambda spec, n: far.keys_computed_at(spec, n) + min(spec.window, n),
                   draw=far.draw, check_draw=far.check_draw, draw_ndim=far.draw_ndim, windowed=True, gated=True,
                   training_free_twin=union.name, local_paths=(SWA.name,),
                   cpu_graph=far.cpu_graph and SWA.cpu_graph, min_window=far.min_window, select=far.select, **fields)
