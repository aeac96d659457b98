"""Checkpoint files, written atomically (``AtomicCheckpointIO``). Every reader is ``sa_lightning.models.checkpoint``."""
from __future__ import annotations

from pathlib import Path

import torch
from lightning.pytorch.plugins import TorchCheckpointIO

from ..utils.atomic import remove_stale_partials, replacing


class AtomicCheckpointIO(TorchCheckpointIO):
    """Lightning's ``TorchCheckpointIO`` with a save that is atomic on every local file system.

    Lightning's own save writes the file under the system's temporary folder and moves it into place; when
    the run folder is on another file system (a cluster's shared disk) that move is a copy into the
    existing ``last.ckpt``, so a ``kill -9`` mid-copy truncates it and leaves an orphan in ``/tmp``. Here
    the checkpoint is written to a hidden ``.<name>.<pid>.partial.ckpt`` beside its target, flushed to
    disk (``fsync``) and renamed into place with ``os.replace``: the target is always the old file or
    the new one. Partial files of killed processes are removed at the next save into that folder; a
    full disk removes its own and says so in one sentence (``WriteError``), the earlier checkpoints intact.
    Remote paths (``s3://`` ...) keep Lightning's fsspec transaction.
    Every shipped config sets it: ``trainer.plugins: [sa_lightning.lit.AtomicCheckpointIO]``.
    """

    def save_checkpoint(self, checkpoint: dict, path, storage_options=None) -> None:
        if storage_options is not None or ("://" in str(path) and not str(path).startswith("file://")):
            return super().save_checkpoint(checkpoint, path, storage_options)
        path = Path(str(path).removeprefix("file://"))
        remove_stale_partials(path.parent)
        with replacing(path, "checkpoint", fsync=True) as tmp, open(tmp, "wb") as fh:
            torch.save(checkpoint, fh)  # through a Python file: a full disk is an OSError, not torch's RuntimeError

    def load_checkpoint(self, path, map_location=lambda storage, loc: storage, weights_only=None) -> dict:
        """Lightning's load, then the one check of what it holds: a file that is not a Lightning checkpoint
        (a bare ``torch.save({...})`` or state dict as ``--ckpt_path`` or ``trainer.fit(ckpt_path=...)``)
        is one sentence, where Lightning's own reader ends in ``KeyError: 'pytorch-lightning_version'``."""
        from ..models.checkpoint import check_lightning_checkpoint

        checkpoint = super().load_checkpoint(path, map_location=map_location, weights_only=weights_only)
        check_lightning_checkpoint(checkpoint, path)
        return checkpoint
