"""Learning-rate schedule: linear warmup, then cosine decay to a floor."""
from __future__ import annotations

import math


def warmup_cosine(warmup: int, total: int, floor: float):
    """Multiplier of the peak lr at optimizer step ``s``: s/warmup, then cosine from 1 down to ``floor`` at ``total``."""

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))

    return factor
