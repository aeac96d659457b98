"""Comparisons item by item: what every experiment that scores a fixed model on a task's items reports (a sweep's
patched model, an evaluation's checkpoints), the twin of ``utils.trained`` (which compares over training seeds).

A run hands over, for one setting and outcome, each σ seed's items by id; one place makes

- ``align``: the seeds on the items every seed scored, in the first seed's order (``Items``: a (σ seeds, items)
  matrix, with a perplexity task's per-token values where it has them);
- ``interval``: their mean with its 95% interval (``utils.stats``: a percentile bootstrap over the items, each its
  mean over the σ seeds; too few documents of a perplexity task cut into segments, ``stats.block_units``);
- ``paired``: A − B on the items both scored, the items drawn once for both sides (``stats.documents_difference``).

Every interval comes from ``utils.stats``; nothing here knows what a task or a variant is.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from .stats import Interval, block_units, documents_difference, estimate


@dataclass
class Items:
    """One setting's scores on one outcome: ``matrix`` (σ seeds, items) on ``ids``; ``tokens`` (σ seeds, items,
    tokens) a perplexity task's per-token values, or None."""

    ids: list
    matrix: np.ndarray
    seeds: list[int]
    tokens: np.ndarray | None = None

    def select(self, ids: list) -> "Items":
        """The same scores on ``ids`` only, in that order."""
        at = {i: j for j, i in enumerate(self.ids)}
        cols = [at[i] for i in ids]
        return replace(self, ids=ids, matrix=self.matrix[:, cols],
                       tokens=None if self.tokens is None else self.tokens[:, cols])

    def units(self) -> np.ndarray:
        """(σ seeds, units): its items, or too few documents' segments (``stats.block_units``)."""
        return block_units(self.matrix, self.tokens)


def align(runs: list[tuple[int, list, list[float], list | None]]) -> Items:
    """``runs``: one (σ seed, ids, one value per item, per-token values or None) per seed; the seeds on the items
    all of them scored, in the first seed's order."""
    common = set.intersection(*(set(ids) for _, ids, _, _ in runs))
    ids = [i for i in runs[0][1] if i in common]
    matrix, tokens = [], []
    for _, run_ids, values, per_token in runs:
        at = {i: j for j, i in enumerate(run_ids)}
        matrix.append([values[at[i]] for i in ids])
        if per_token is not None:
            tokens.append([per_token[at[i]] for i in ids])
    return Items(ids, np.array(matrix, dtype=np.float64), [seed for seed, *_ in runs],
                 np.array(tokens) if tokens else None)


def interval(items: Items, seed: int = 0) -> Interval:
    """The mean over σ seeds and items with its 95% interval over the units (the items, or segments)."""
    return estimate(items.units(), "items", seed=seed)


def paired(a: Items, b: Items, seed: int = 0) -> Interval | None:
    """A − B on the items both scored, in A's order (None: none in common)."""
    ids = [i for i in a.ids if i in set(b.ids)]
    if not ids:
        return None
    a, b = a.select(ids), b.select(ids)
    return documents_difference(a.matrix, a.tokens, b.matrix, b.tokens, seed=seed)
