"""Training-free inference: swap the prefill attention of Hugging Face models for SWA, SA, SA+SWA or MoBA.

The patcher itself is model code (``sa_lightning.models.patcher``, which the Qwen3 backbone also trains
through); this package runs it: the lm-eval model and the window sweeps.
"""
import importlib


def __getattr__(name: str):  # loaded on first use (PEP 562): ``generate --help`` parses before torch is imported
    if name in ("PatchSpec", "patch", "patched", "unpatch"):
        value = getattr(importlib.import_module("..models.patcher", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["PatchSpec", "patch", "patched", "unpatch"]
