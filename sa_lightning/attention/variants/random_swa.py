"""Gated random+SWA: the random-keys control and SWA as two paths mixed by learned output gates, the control
beside the paper's gated SA+SWA (``random_swa_union`` is its training-free twin)."""
from __future__ import annotations

from ..random_keys import check_keys, draw_keys
from ..registry import Variant, register_variant
from .random import RANDOM
from .random_swa_union import keys_attended_row, mask
from .swa import SWA


def kernel(call):
    return (*RANDOM.kernel(call), *SWA.kernel(call))


RANDOM_SWA = register_variant(Variant(
    name="random_swa", label="Random+SWA (gated)", color="#48C9B0", marker="d", paths=("random", "swa"),
    kernel=kernel, backends=("banded", "dense"), mask=mask,
    keys_attended_row=keys_attended_row,  # the keys either path reads: the union
    keys_computed_at=lambda spec, n: RANDOM.keys_computed_at(spec, n) + min(spec.window, n),
    draw=draw_keys, check_draw=check_keys, draw_ndim=2,
    windowed=True, gated=True, training_free_twin="random_swa_union", local_paths=("swa",),
    description="control: the random keys and SWA, mixed by learned output gates",
))
