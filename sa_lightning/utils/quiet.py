"""The lines of Lightning and torch a user can do nothing about, silenced by their exact text: for the command line
(``main``) and for the worker processes a study trains its cells in (``experiments.training``)."""
from __future__ import annotations


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
