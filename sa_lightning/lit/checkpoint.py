"""One check that a checkpoint file can be read, shared by training resumes and evaluation."""
from __future__ import annotations

import pickle
import zipfile
from pathlib import Path

import torch


def read_checkpoint(path: str | Path, map_location="cpu", mmap: bool = False) -> dict:
    """``torch.load(weights_only=True)`` with one clear sentence for a missing, truncated or corrupt file.

    ``mmap=True`` maps the tensors instead of reading them: a cheap check before a long run starts.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {str(path)!r} does not exist; pass a .ckpt file that `cli.py fit` wrote "
                                "(for example runs/tiny/tb/version_0/checkpoints/last.ckpt).")
    try:
        return torch.load(path, map_location=map_location, weights_only=True, mmap=mmap)
    except (RuntimeError, EOFError, pickle.UnpicklingError, zipfile.BadZipFile, ValueError, OSError) as err:
        first = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise ValueError(f"checkpoint {str(path)!r} cannot be read (truncated, corrupt, or not a torch checkpoint): "
                         f"{first}. Nothing was trained; pass an intact checkpoint.") from None
