"""The lines of Lightning and torch a user can do nothing about, silenced by their exact text: for the command line
(``main``) and for the worker processes a study trains its cells in (``experiments.training``); and the profiler's
own lines on file descriptor 2 (``quiet_profiler``)."""
from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
from typing import Iterator


class _LightningAdverts:
    """A logging filter that drops Lightning's advertising lines ("💡 Tip: ... try installing litlogger" and
    "... litmodels"), which it prints in every fit, validate and test; every other line passes."""

    PRODUCTS = ("litlogger", "litmodels")

    def filter(self, record) -> bool:
        message = str(record.msg)
        return not (message.startswith("💡 Tip:") and any(p in message for p in self.PRODUCTS))


def quiet_lightning(command: str) -> None:
    """Silence, by their exact text, the lines a user of ``command`` can do nothing about; every other warning
    and line is kept:

    - Lightning's advertising lines (``_LightningAdverts``);
    - torch's FutureWarning ```isinstance(treespec, LeafSpec)` is deprecated``, which Lightning's own code
      (``lightning/pytorch/utilities/_pytree.py``) triggers in every fit and test;
    - in ``validate``, ``test`` and ``predict``: ModelCheckpoint's "The dirpath has changed from ... won't be
      reloaded", said of every checkpoint these commands load, since each writes into a new logger version.

    Loggers are configured by name, so nothing of Lightning is imported here (``--help`` stays fast)."""
    import logging
    import warnings

    warnings.filterwarnings("ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated",
                            category=FutureWarning)
    if command in ("validate", "test", "predict"):
        warnings.filterwarnings("ignore", message=r"The dirpath has changed from .* won't be reloaded",
                                category=UserWarning)
    # rank_zero_info logs through the rank_zero module's logger of lightning.pytorch (or of lightning.fabric)
    for name in ("lightning.pytorch.utilities.rank_zero", "lightning.fabric.utilities.rank_zero"):
        logger = logging.getLogger(name)
        if not any(isinstance(f, _LightningAdverts) for f in logger.filters):
            logger.addFilter(_LightningAdverts())


#: what the CPU profiler itself writes to the process's stderr (fd 2, from C++) on every start and stop:
#: Kineto's ``USDT:/STAGE: ... SyncActivityProfilerHandler.cpp:52] profiler_start`` lines and c10's warning
#: that a block allocated before the profile started has no free event (which ``peak_bytes`` expects)
PROFILER_CHATTER = re.compile(r"Profiler\w*\.cpp:\d+\]|allocated before the profiling started")


@contextlib.contextmanager
def quiet_profiler() -> Iterator[None]:
    """Hold back the profiler's own lines (``PROFILER_CHATTER``), which C++ writes straight to file
    descriptor 2, where no Python filter reaches: fd 2 goes to a temporary file while the block runs, then
    every other line in it (an error, a warning of the code under measurement) is written to stderr."""
    sys.stderr.flush()
    try:
        saved = os.dup(2)
    except OSError:  # no fd 2 to redirect (a closed stderr): nothing to hold back either
        yield
        return
    with tempfile.TemporaryFile(mode="w+b") as held:
        os.dup2(held.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            held.seek(0)
            kept = [line for line in held.read().decode(errors="replace").splitlines(keepends=True)
                    if not PROFILER_CHATTER.search(line)]
            if kept:
                sys.stderr.write("".join(kept))
                sys.stderr.flush()
