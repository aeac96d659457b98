"""Gated bucketed SA + SWA: the bucketed SA path and SWA's, mixed by learned output gates, beside the paper's gated
SA+SWA (``sa_bucket_swa_union`` is its training-free twin)."""
from __future__ import annotations

from .sa_bucket import SA_BUCKET
from .sa_bucket_swa_union import SA_BUCKET_SWA_UNION
from .swa import gated_with_swa

VARIANT = SA_BUCKET_SWA = gated_with_swa(
    SA_BUCKET, SA_BUCKET_SWA_UNION, name="sa_bucket_swa", label="SA-bucket+SWA (gated)", color="#B7950B",
    marker="*", uses_permutation=True, circular=False,
    description="bucketed SA and SWA, mixed by learned output gates",
)
