"""Gated strided+SWA: the strided control and SWA as two paths mixed by learned output gates, the control
beside the paper's gated SA+SWA (``strided_swa_union`` is its training-free twin)."""
from __future__ import annotations

from ..registry import Variant, register_variant
from .strided import STRIDED
from .strided_swa_union import keys_attended_row, mask
from .swa import SWA


def kernel(call):
    return (*STRIDED.kernel(call), *SWA.kernel(call))


STRIDED_SWA = register_variant(Variant(
    name="strided_swa", label="Strided+SWA (gated)", color="#A569BD", marker="H", paths=("strided", "swa"),
    kernel=kernel, backends=("banded", "dense"), mask=mask,
    keys_attended_row=keys_attended_row,  # the keys either path reads: the union
    keys_computed_at=lambda spec, n: STRIDED.keys_computed_at(spec, n) + min(spec.window, n),
    windowed=True, gated=True, training_free_twin="strided_swa_union", local_paths=("swa",),
    description="control: the strided pattern and SWA, mixed by learned output gates",
))
