"""One check that a checkpoint file can be read, shared by training resumes and evaluation, and the
weights-only start of a new run (``model.init_weights``)."""
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
