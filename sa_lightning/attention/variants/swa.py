"""Sliding-window attention: query i reads keys j with 0 <= i - j <= w - 1."""
from __future__ import annotations

from .. import masks, oracle
from ..banded import banded_attention
from ..functional import sliding_window_attention
from ..registry import Variant, register_variant
from ..sinks import causal_keys
from ._common import dense_with_lse


def kernel(call):
    return (sliding_window_attention(call.q, call.k, call.v, call.window, scale=call.scale, backend=call.backend),)


def kernel_with_lse(call):
    w = call.window
    if call.q.shape[2] < 2 * w:
        return dense_with_lse(call, masks.sliding_window(w))
    return banded_attention(call.q, call.k, call.v, before=w - 1, after=0, scale=call.scale, return_lse=True)


SWA = register_variant(Variant(
    name="swa", label="SWA", color="#4A90D9", marker="o", paths=("swa",),
    kernel=kernel, kernel_with_lse=kernel_with_lse, backends=("banded", "flex", "dense"),
    mask=lambda spec, n, perm=None, lengths=None: masks.sliding_window(spec.window),
    oracle_mask=lambda spec, q, k, perm, lengths: oracle.swa_mask(q.shape[2], spec.window, q.device),
    keys_attended_row=lambda spec, length, row: causal_keys(length, spec.window),
    keys_computed_at=lambda spec, n: min(spec.window, n),
    windowed=True, local_paths=("swa",),
    description="sliding-window attention over the last w keys",
))
