"""Gated random+SWA: the random-keys control and SWA as two paths mixed by learned output gates, the control
beside the paper's gated SA+SWA (``random_swa_union`` is its training-free twin)."""
from __future__ import annotations

from .random import RANDOM
from .random_swa_union import RANDOM_SWA_UNION
from .swa import gated_with_swa

VARIANT = RANDOM_SWA = gated_with_swa(
    RANDOM, RANDOM_SWA_UNION, name="random_swa", label="Random+SWA (gated)", color="#48C9B0", marker="d",
    description="control: the random keys and SWA, mixed by learned output gates",
)
