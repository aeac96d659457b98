"""Whether this copy of sa_lightning runs from a checkout of the repository (``cli.py``, ``tests/`` and
``configs/`` beside the package) or from an installed wheel, which ships the package alone."""
from __future__ import annotations

from pathlib import Path

#: the folder of the sa_lightning package (what ships in the wheel, its package data included)
PACKAGE = Path(__file__).resolve().parents[1]


def checkout_root() -> Path | None:
    """The repository the package was imported from, or None for an installed copy. Both files are asked for:
    a site-packages folder may well hold some other project's stray ``cli.py`` or ``tests/``."""
    root = PACKAGE.parent
    if (root / "cli.py").is_file() and (root / "pyproject.toml").is_file():
        return root
    return None
