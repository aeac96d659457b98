"""argparse types for counts and seeds: a bad value is refused while the command line is parsed, in one line
(``argument --seeds: must be an integer from 0 to 2**32 - 1, got -1``), before anything runs or is written."""
from __future__ import annotations

import argparse


def positive_int(text: str) -> int:
    """Sizes, counts and lengths: >= 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def non_negative_int(text: str) -> int:
    """Counts where 0 means "none" (bootstrap iterations): >= 0."""
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def seed(text: str) -> int:
    """A random seed as ``torch.Generator.manual_seed`` and numpy take it: 0 to 2**32 - 1."""
    value = int(text)
    if not 0 <= value < 2**32:
        raise argparse.ArgumentTypeError(f"must be an integer from 0 to 2**32 - 1, got {value}")
    return value
