"""Fixed-σ SA: SA's mask and kernels, with one permutation per layer drawn once from the run's seed and kept for the
whole of training and evaluation (in evaluation, one per (seed, layer, length), whatever the input). Against SA it
asks whether drawing σ afresh matters: a fixed σ is a fixed, irregular graph of SA's degree."""
from __future__ import annotations

import dataclasses

from .sa import SA

VARIANT = SA_FIXED = dataclasses.replace(
    SA, name="sa_fixed", label="SA (fixed σ)", color="#F5B041", marker="v", frozen=True, title="SA, fixed σ",
    description="control: SA with one permutation per layer for the whole run (fixed σ)",
)
