"""One check that a checkpoint file can be read, shared by training resumes and evaluation."""
from __future__ import annotations

import pickle
import zipfile
from pathlib import Path

import torch


def read_checkpoint(path: str | Path, map_location="cpu", mmap: bool = False, weights_only: bool = True) -> dict:
    """``torch.load(weights_only=True)`` with one clear sentence for a missing, truncated or corrupt file.

    ``mmap=True`` maps the tensors instead of reading them: a cheap check before a long run starts.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {str(path)!r} does not exist; pass a .ckpt file that `cli.py fit` wrote "
                                "(for example runs/tiny/tb/version_0/checkpoints/last.ckpt).")
    try:
        return torch.load(path, map_location=map_location, weights_only=weights_only, mmap=mmap)
    except pickle.UnpicklingError as err:
        if "unsupported global" not in str(err).lower():  # garbage bytes also fail the weights-only unpickler
            raise ValueError(f"checkpoint {str(path)!r} cannot be read (truncated, corrupt, or not a torch "
                             f"checkpoint). Nothing was trained; pass an intact checkpoint.") from None
        raise ValueError(f"checkpoint {str(path)!r} holds Python objects beyond tensors and plain types, which "
                         "could run code when loaded, so it is loaded with weights_only=True and refused; if you "
                         "trust its source, pass --weights_only false.") from None
    except (RuntimeError, EOFError, zipfile.BadZipFile, ValueError, OSError) as err:
        first = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise ValueError(f"checkpoint {str(path)!r} cannot be read (truncated, corrupt, or not a torch checkpoint): "
                         f"{first}. Nothing was trained; pass an intact checkpoint.") from None
