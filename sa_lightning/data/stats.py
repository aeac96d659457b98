"""Reference numbers for a trained model to beat."""
from __future__ import annotations

import math

import numpy as np


def unigram_perplexity(train_tokens: np.ndarray, val_tokens: np.ndarray, vocab_size: int) -> float:
    """Perplexity on ``val_tokens`` of the add-one-smoothed unigram distribution of ``train_tokens``:
    what a model that ignores all context achieves."""
    counts = np.bincount(np.asarray(train_tokens, dtype=np.int64), minlength=vocab_size).astype(np.float64) + 1.0
    log_p = np.log(counts / counts.sum())
    nll = -log_p[np.asarray(val_tokens, dtype=np.int64)].mean()
    return float(math.exp(nll))
