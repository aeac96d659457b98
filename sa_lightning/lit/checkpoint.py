"""Checkpoint files: written atomically (``AtomicCheckpointIO``), and one check that a file can be read,
shared by training resumes and evaluation, and the weights-only start of a new run (``model.init_weights``)."""
from __future__ import annotations

import pickle
import zipfile
from pathlib import Path

import torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO

from ..utils.atomic import remove_stale_partials, replacing
from .resume import checkpoint_candidates


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


def read_checkpoint(path: str | Path, map_location="cpu", mmap: bool = False, weights_only: bool = True) -> dict:
    """``torch.load(weights_only=True)`` with one clear sentence for a missing, truncated or corrupt file.

    ``mmap=True`` maps the tensors instead of reading them: a cheap check before a long run starts.
    """
    path = Path(path)
    if path.is_dir():
        found = checkpoint_candidates(path)  # newest first, never a partial write
        newest = f" (the newest in it is {str(found[0])!r})" if found else " (it holds no .ckpt file)"
        raise ValueError(f"checkpoint {str(path)!r} is a folder, not a checkpoint file{newest}; pass a .ckpt file, "
                         "or --ckpt_path last with --trainer.default_root_dir set to the run's folder.")
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


def load_weights(net: torch.nn.Module, path: str | Path) -> None:
    """Copy a ``cli.py fit`` checkpoint's model weights into ``net``, refusing in one sentence any parameter
    whose name or shape differs (nothing is loaded then)."""
    state = read_checkpoint(path, mmap=True).get("state_dict") or {}  # mapped: the optimizer state is never read
    weights = {k[len("net."):]: v for k, v in state.items() if k.startswith("net.")}
    own = net.state_dict()
    shapes = [(k, tuple(weights[k].shape), tuple(v.shape)) for k, v in own.items()
              if k in weights and weights[k].shape != v.shape]
    if shapes:
        key, theirs, ours = shapes[0]
        more = f" (and {len(shapes) - 1} more)" if len(shapes) > 1 else ""
        raise ValueError(f"model.init_weights {str(path)!r} does not fit this model: {key} is {theirs} in the checkpoint "
                         f"and {ours} here{more}; init_weights keeps every shape, so change only settings that keep "
                         "them (window, variant among swa/sa/full/moba, backend), or drop init_weights.")
    missing, extra = sorted(set(own) - set(weights)), sorted(set(weights) - set(own))
    if missing or extra:
        names = "; ".join(filter(None, [f"{missing[0]} is missing there" if missing else "",
                                        f"{extra[0]} has no place here" if extra else ""]))
        raise ValueError(f"model.init_weights {str(path)!r} does not fit this model: {names} "
                         f"({len(missing)} missing, {len(extra)} extra parameters; sa_swa has two output gates, sa "
                         "and swa, where the single-path variants have one); drop init_weights or match the variant's paths.")
    net.load_state_dict(weights)
