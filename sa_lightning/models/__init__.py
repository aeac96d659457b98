"""Models: the paper's Transformer++, a Hugging Face (Qwen3) backbone, and their configuration presets.

Its names load on first use (PEP 562), so that a command's ``--help`` in this package (``export``) parses before
torch is imported."""
from __future__ import annotations

import importlib

#: name -> the module that defines it
_LAZY = {"ModelConfig": ".config", "PRESETS": ".config", "Transformer": ".transformer"}


def __getattr__(name: str):
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name], __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def build_model(cfg):
    """The network ``cfg.backbone`` names: the Transformer++ or the Qwen3 backbone."""
    if cfg.backbone == "qwen3":
        from .hf_backbone import HFBackbone

        return HFBackbone(cfg)
    from .transformer import Transformer

    return Transformer(cfg)


__all__ = ["ModelConfig", "PRESETS", "Transformer", "build_model"]
