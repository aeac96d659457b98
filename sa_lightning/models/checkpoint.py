"""Checkpoints, read: the one module every reader goes through.

``cli.py fit`` writes them (``sa_lightning.lit.AtomicCheckpointIO``); resuming, ``model.init_weights``,
evaluation, the analyses and the benchmarks read them here, with one rule for parameter names
(``NET``), one architecture check (``check_architecture``) and one wording for each way a file can fail.
Checkpoints are loaded with ``weights_only=True``: reading one runs no code.
"""
from __future__ import annotations

import os
import pickle
import zipfile
from pathlib import Path

import torch

from .config import ModelConfig, upgrade_arch

#: the LightningModule holds the network as ``net``: its parameters are ``net.<name>`` in every checkpoint
#: (compilation is in place, so no wrapper prefix ever appears)
NET = "net."
#: the architecture fields a checkpoint's weights depend on: a run that sets another value is refused
ARCH_KEYS = ("vocab_size", "d_model", "n_layer", "n_head", "attention.variant")
#: files preferred by ``--ckpt_path last`` among equally new ones: ModelCheckpoint's last (and its -vN
#: copies), SLURM's requeue file; any other ``*.ckpt`` (the periodic ``stepN.ckpt``) is a fallback
LAST_PATTERNS = ("last.ckpt", "last-v*.ckpt", "hpc_ckpt_*.ckpt")


def checkpoint_candidates(*roots: str | os.PathLike) -> list[Path]:
    """Every checkpoint file under ``roots`` (recursively), newest first; among equally new files the
    last/hpc ones first. Hidden files (``AtomicCheckpointIO``'s partial writes) are never candidates."""
    found = {p for root in map(Path, roots) if root.is_dir() for p in root.rglob("*.ckpt")
             if p.is_file() and not p.name.startswith(".")}

    def newest_first(p: Path):
        return (-p.stat().st_mtime_ns, not any(p.match(pattern) for pattern in LAST_PATTERNS), str(p))

    return sorted(found, key=newest_first)


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
        ckpt = torch.load(path, map_location=map_location, weights_only=weights_only, mmap=mmap)
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
    if not isinstance(ckpt, dict):  # torch.save(tensor) or of a list: no reader here can use it
        raise ValueError(f"checkpoint {str(path)!r} holds a {type(ckpt).__name__}, not a dict of weights; pass a "
                         "checkpoint `cli.py fit` wrote (or, for model.init_weights, a state dict).")
    return _upgrade(ckpt)


def _upgrade(ckpt):
    """Checkpoints from before ``ModelConfig.attention`` hold the attention settings flat in ``arch``; every
    reader sees them in today's layout (what LightningCLI re-parses on a resume included)."""
    if isinstance(ckpt, dict):
        for holder in (ckpt.get("hyper_parameters"), ckpt.get("sa_lightning")):
            if isinstance(holder, dict) and isinstance(holder.get("arch"), dict):
                holder["arch"] = upgrade_arch(holder["arch"])
    return ckpt


def load_weights(net: torch.nn.Module, path: str | Path) -> None:
    """Copy the weights in ``path`` into ``net``: a ``cli.py fit`` checkpoint's model, or a bare state dict
    (``torch.save(net.state_dict())``, or the LightningModule's, whose names start with ``net.``). Any parameter
    whose name or shape differs is refused in one sentence naming the first (nothing is loaded then)."""
    weights = init_weights_of(read_checkpoint(path, mmap=True), path)  # mapped: the optimizer state is never read
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
    if missing and len(extra) == len(weights):
        raise ValueError(f"model.init_weights {str(path)!r} does not fit this model: none of its {len(weights)} "
                         f"parameter names is one of this model's (its first is {extra[0]}, this model's "
                         f"{next(iter(own))}); pass weights saved from this model (net.state_dict(), with or "
                         "without the net. prefix) or a checkpoint `cli.py fit` wrote.")
    if missing or extra:
        names = "; ".join(filter(None, [f"{missing[0]} is missing there" if missing else "",
                                        f"{extra[0]} has no place here" if extra else ""]))
        gates = any(".gate.gates." in k for k in missing[:1] + extra[:1])
        why = ("; sa_swa has two output gates, sa and swa, where the single-path variants have one); drop "
               "init_weights or match the variant's paths.") if gates else \
            "); drop init_weights, or pass weights of a model with this one's layers and variant."
        raise ValueError(f"model.init_weights {str(path)!r} does not fit this model: {names} "
                         f"({len(missing)} missing, {len(extra)} extra parameters{why}")
    net.load_state_dict(weights)


def _holds(ckpt) -> str:
    """What a checkpoint file that is not the expected kind holds, in a few words: its top-level keys."""
    if not isinstance(ckpt, dict):
        return f"a {type(ckpt).__name__}, not a dict"
    if not ckpt:
        return "an empty dict"
    keys = list(ckpt)
    shown = ", ".join(repr(k) for k in keys[:4]) + (f" and {len(keys) - 4} more" if len(keys) > 4 else "")
    if all(isinstance(v, torch.Tensor) for v in ckpt.values()):
        return f"a bare state dict of {len(keys)} tensors ({shown})"
    return f"a dict with the top-level keys {shown}"


def init_weights_of(ckpt: dict, path: str | Path) -> dict:
    """The network's weights, named as in the ``nn.Module``, from what ``model.init_weights`` names: a
    ``cli.py fit`` checkpoint, or a bare state dict of tensors with or without the ``net.`` prefix."""
    if isinstance(ckpt.get("state_dict"), dict):
        state = ckpt["state_dict"]
    elif ckpt and all(isinstance(v, torch.Tensor) for v in ckpt.values()):
        state = ckpt
    else:
        raise ValueError(f"model.init_weights {str(path)!r} holds neither a checkpoint `cli.py fit` wrote nor a state "
                         f"dict of tensors: it holds {_holds(ckpt)}.")
    if not state:
        raise ValueError(f"model.init_weights {str(path)!r} holds no weights (its state dict is empty).")
    if any(k.startswith(NET) for k in state):
        return {k[len(NET):]: v for k, v in state.items() if k.startswith(NET)}
    return dict(state)


def check_lightning_checkpoint(ckpt, path: str | Path) -> None:
    """A checkpoint to resume, validate or test from (``--ckpt_path``) must be one Lightning wrote (``cli.py
    fit``); anything else is refused in one sentence saying what it holds and, for bare weights, the way in."""
    if isinstance(ckpt, dict) and "pytorch-lightning_version" in ckpt and isinstance(ckpt.get("state_dict"), dict):
        return
    raise ValueError(f"checkpoint {str(path)!r} is not a Lightning checkpoint written by `cli.py fit`: it holds "
                     f"{_holds(ckpt)}; for bare weights (a state dict), pass --model.init_weights {path} "
                     "instead of --ckpt_path.")


def network_weights(ckpt: dict) -> dict:
    """The network's parameters from a checkpoint, named as in the ``nn.Module`` (the one prefix rule)."""
    state = ckpt.get("state_dict") or {}
    return {k[len(NET):]: v for k, v in state.items() if k.startswith(NET)}


def _field(arch: dict, dotted: str):
    for part in dotted.split("."):
        arch = arch.get(part) if isinstance(arch, dict) else None
    return arch


def check_architecture(saved: dict, cfg: ModelConfig) -> None:
    """Refuse, in one sentence, a model config whose architecture differs from a checkpoint's ``arch``."""
    ours = cfg.to_dict()
    for key in ARCH_KEYS:
        theirs = _field(saved, key)
        if theirs is not None and theirs != _field(ours, key):
            raise ValueError(
                f"the checkpoint has model arch.{key}={theirs!r} but this run configures {_field(ours, key)!r}; "
                "resume with the checkpoint's model and data config (its config.yaml sits next to the logs).")


def load_checkpoint(path: str | Path, map_location: str | torch.device = "cpu") -> tuple[torch.nn.Module, dict]:
    """(model in eval mode, info) from a ``cli.py fit`` checkpoint; ``info`` holds the tokenizer name,
    the step and the architecture."""
    from . import build_model

    path = Path(path)
    ckpt = read_checkpoint(path, map_location=map_location)
    arch = (ckpt.get("hyper_parameters") or {}).get("arch") if isinstance(ckpt, dict) else None
    if not isinstance(arch, dict) or "state_dict" not in ckpt:
        raise ValueError(f"checkpoint {str(path)!r} is not an sa_lightning checkpoint: it has no model architecture "
                         "(hyper_parameters.arch); evaluate checkpoints written by `cli.py fit`.")
    try:
        cfg = ModelConfig.from_dict(arch)
    except (TypeError, ValueError) as err:
        raise ValueError(f"checkpoint {str(path)!r} holds an architecture this version cannot build: {err}") from None
    model = build_model(cfg)
    try:
        missing, unexpected = model.load_state_dict(network_weights(ckpt), strict=False)
    except RuntimeError as err:  # a tensor of another shape than its architecture gives it
        sizes = [line.strip().rstrip(".") for line in str(err).splitlines() if "size mismatch" in line]
        raise ValueError(f"checkpoint {str(path)!r} holds weights whose sizes do not match its own architecture "
                         f"({sizes[0] if sizes else str(err).splitlines()[0]}); it was edited, or written by "
                         "another model.") from None
    if missing or unexpected:
        raise ValueError(f"checkpoint {str(path)!r} does not match its own architecture: missing {missing[:3]}, "
                         f"unexpected {unexpected[:3]}.")
    model.eval()
    data = ckpt.get("LMDataModule") or {}
    info = {"path": str(path), "step": ckpt.get("global_step"), "arch": cfg.to_dict(),
            "tokenizer": data.get("tokenizer", "embedded")}
    return model, info
