"""Where sa_lightning keeps what it derives from data: packed tokens, stand-in tokenizers, lm-eval's task names.
``$SA_LIGHTNING_CACHE``, else ``~/.cache/sa_lightning/data`` (a light module: no import of the data stack)."""
from __future__ import annotations

import os


def data_cache() -> str:
    """The data cache folder as configured (``~`` not expanded: a config may show it as the user wrote it)."""
    return os.environ.get("SA_LIGHTNING_CACHE", "~/.cache/sa_lightning/data")
