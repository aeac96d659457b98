"""Test-only callbacks (importable by subprocess runs through PYTHONPATH)."""
from __future__ import annotations

import hashlib
import json
import os

import lightning as L


def row_hashes(batch) -> list[str]:
    return [hashlib.sha1(row.numpy().tobytes()).hexdigest()[:16] for row in batch.cpu()]


class RecordBatches(L.Callback):
    """Records every training batch (as row hashes) and loss, per rank, to ``<out>/rank<r>.json``."""

    def __init__(self, out: str):
        self.out = out
        self.steps: list[dict] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.steps.append({"step": trainer.global_step, "rows": row_hashes(batch), "loss": float(outputs["loss"])})

    def on_fit_end(self, trainer, pl_module):
        os.makedirs(self.out, exist_ok=True)
        with open(os.path.join(self.out, f"rank{trainer.global_rank}.json"), "w") as f:
            json.dump(self.steps, f)
