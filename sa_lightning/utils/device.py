"""``--device``, checked where a command reads it: a device this machine does not have is one sentence that
says what it does have, before any model is built or loaded (torch's own answer comes later, from deep
inside: ``AssertionError: Torch not compiled with CUDA enabled``)."""
from __future__ import annotations

import torch


def usable_devices() -> list[str]:
    """The devices PyTorch can use on this machine, as ``--device`` takes them: cpu, then each CUDA GPU, then
    any other accelerator torch reports available (mps, xpu)."""
    names = ["cpu"]
    if torch.cuda.is_available():
        count = torch.cuda.device_count()
        names += ["cuda"] if count == 1 else [f"cuda:{i}" for i in range(count)]
    for kind in ("mps", "xpu"):
        backend = getattr(torch.backends, kind, None) if kind == "mps" else getattr(torch, kind, None)
        if backend is not None and getattr(backend, "is_available", lambda: False)():
            names.append(kind)
    return names


def _or_list(names: list[str], flag: str) -> str:
    return " or ".join(f"{flag} {n}" for n in names)


def check_device(name: str, flag: str = "--device") -> torch.device:
    """``name`` as a ``torch.device``, refused in one sentence when torch does not know it or this machine
    cannot run it (no CUDA build or GPU, a GPU index past the last one, mps or xpu missing)."""
    text = str(name).strip()
    try:
        device = torch.device(text)
    except (RuntimeError, ValueError):
        hint = " (a GPU is cuda)" if text.lower().startswith("gpu") else ""
        raise ValueError(f"{flag} {text!r} is not a device PyTorch knows{hint}; use "
                         f"{_or_list(usable_devices(), flag)}.") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            why = f"torch {torch.__version__} was built without CUDA" if torch.version.cuda is None and \
                torch.version.hip is None else "torch.cuda.is_available() is False"
            raise ValueError(f"{flag} {text} was asked for, but this machine has no CUDA GPU that PyTorch can use "
                             f"({why}); use {_or_list(usable_devices(), flag)}.")
        count = torch.cuda.device_count()
        if device.index is not None and device.index >= count:
            raise ValueError(f"{flag} {text} was asked for, but this machine has {count} CUDA GPU"
                             f"{'s' if count != 1 else ''} (cuda:0 to cuda:{count - 1}); use one of those.")
    elif device.type in ("mps", "xpu"):
        backend = torch.backends.mps if device.type == "mps" else getattr(torch, "xpu", None)
        if backend is None or not backend.is_available():
            raise ValueError(f"{flag} {text} was asked for, but PyTorch cannot use {device.type} on this machine; "
                             f"use {_or_list(usable_devices(), flag)}.")
    elif device.type != "cpu":
        raise ValueError(f"{flag} {text}: this command runs on cpu or a GPU; use {_or_list(usable_devices(), flag)}.")
    return device
