"""Gated strided+SWA: the strided control and SWA as two paths mixed by learned output gates, the control
beside the paper's gated SA+SWA (``strided_swa_union`` is its training-free twin)."""
from __future__ import annotations

from .strided import STRIDED
from .strided_swa_union import STRIDED_SWA_UNION
from .swa import gated_with_swa

VARIANT = STRIDED_SWA = gated_with_swa(
    STRIDED, STRIDED_SWA_UNION, name="strided_swa", label="Strided+SWA (gated)", color="#A569BD", marker="H",
    description="control: the strided pattern and SWA, mixed by learned output gates",
)
