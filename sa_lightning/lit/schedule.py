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


def tokens_per_step(trainer, datamodule) -> int:
    """Training tokens one optimizer step consumes over all ranks: batch x seq x accumulation x world."""
    return datamodule.batch_size * datamodule.seq_len * trainer.accumulate_grad_batches * trainer.world_size


def steps_for_tokens(tokens: int, tokens_per_step: int) -> int:
    """Optimizer steps that consume ``tokens`` (rounded up): 15B / (16 x 2048 x 30 x 4) = 3815."""
    if tokens_per_step < 1:
        raise ValueError(f"tokens per optimizer step must be >= 1, got {tokens_per_step}.")
    return math.ceil(tokens / tokens_per_step)
