"""Data: document sources, the embedded corpus and tokenizer, packing, exact sharding, the DataModule.

The names below load on first use (PEP 562), so that a light submodule (``data.tokenizer``, which the model
presets read) does not import Lightning with the DataModules: ``bench prefill`` and a sweep start seconds sooner.
"""
from __future__ import annotations

import importlib

_HOMES = {"SourceConfig": "corpus", "documents": "corpus", "embedded_documents": "corpus",
          "LMDataModule": "datamodule", "PackedBlocks": "packing", "prepare_tokens": "packing",
          "BlockSampler": "sampler", "RecallTask": "synthetic", "SyntheticDataModule": "synthetic",
          "load_tokenizer": "tokenizer"}

__all__ = list(_HOMES)


def __getattr__(name: str):
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{home}", __name__), name)
    globals()[name] = value  # once
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
