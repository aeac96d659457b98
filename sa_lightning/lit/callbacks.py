"""Training callbacks that need to know our batch layout."""
from __future__ import annotations

from lightning.pytorch.callbacks import ThroughputMonitor


class TokenThroughput(ThroughputMonitor):
    """Lightning's ThroughputMonitor for (B, seq_len + 1) token batches: logs samples/s, trained
    tokens/s (``items_per_sec``; Lightning sums ``length_fn`` per batch) and, on GPUs with known peak flops, MFU from ``LitLM.flops_per_batch``."""

    def __init__(self, window_size: int = 20, **kwargs):
        super().__init__(batch_size_fn=lambda batch: batch.size(0), length_fn=lambda batch: batch[:, 1:].numel(),
                         window_size=window_size, **kwargs)
