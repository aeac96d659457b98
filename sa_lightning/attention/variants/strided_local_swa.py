"""Gated local-band strided+SWA: the local-band strided control and SWA as two paths mixed by learned output gates,
the deterministic control beside the paper's gated SA+SWA (``strided_local_swa_union`` is its training-free twin)."""
from __future__ import annotations

from .strided_local import STRIDED_LOCAL
from .strided_local_swa_union import STRIDED_LOCAL_SWA_UNION
from .swa import gated_with_swa

VARIANT = STRIDED_LOCAL_SWA = gated_with_swa(
    STRIDED_LOCAL, STRIDED_LOCAL_SWA_UNION, name="strided_local_swa", label="Strided+local+SWA (gated)",
    color="#AF7AC5", marker="P", revision=2,  # 2: (h, s) tuned for the model's depth (``strided_local``)
    description="control: the local-band strided pattern and SWA, mixed by learned output gates",
)
