"""Confidence intervals and paired differences: seeded percentile bootstraps, vectorised with numpy.

Every interval the project reports is made one of these ways (the reports quote them):

- **One seed** (a deterministic mode; ``bootstrap_mean``): the items (documents, questions) are drawn with
  replacement ``resamples`` times, and the interval is the 2.5th and 97.5th percentiles of the drawn means
  (a percentile bootstrap). An accuracy is the mean of 0/1 items, so it gets the same bootstrap: one method for
  every number, differences included, rather than a Wilson interval for accuracies alone. At few items a
  percentile bootstrap is too narrow (all of 5 items right gives [100, 100]).
- **Several seeds** (a stochastic mode; ``two_level_bootstrap``): the items are drawn with replacement, then
  within each drawn item its seeds are drawn with replacement, and the mean of all of it is one replicate. The
  seeds are drawn per item because a stochastic mode draws its randomness per input (σ from seed, layer and the
  row's tokens), so one item's seeds are independent of another's. It counts the seed noise twice (inside each
  item's mean and in the redraw), so it errs wide: at or above 95% coverage. The seed-to-seed spread is reported on
  its own: the standard deviation over seeds of each seed's whole-task mean.
- **A paired difference** A − B (``paired_difference``): A and B are scored on the same items; the items are
  drawn once for both, each side's seeds are drawn within each drawn item as above, and a replicate is the mean of
  the per-item differences. Pairing removes what the items share (an easy item is easy for both), so the
  interval is narrower than that of two independent bootstraps.
- **A paired difference pooled over groups** (``pooled_paired_difference``): where each training seed's models
  answered their own items (the long-range study draws its validation set from the cell's seed), the seeds are
  drawn with replacement, then each drawn seed's items, once for both sides: the interval holds the training
  seed's noise too, and each seed's own difference is reported beside it.

An interval needs at least 2 items: with one (a single long document) its bounds are NaN, and ``verdict`` says
"not separable at this size". A fixed ``seed`` makes every interval reproducible.
"""
from __future__ import annotations

import math
import zlib
from dataclasses import asdict, dataclass

import numpy as np

#: resamples per interval
RESAMPLES = 2000
#: the interval's coverage
LEVEL = 0.95
#: the most (resample, item, seed) draws held at once; larger sets are drawn in chunks
_CHUNK = 4_000_000

BETTER, WORSE, TIED = "better", "worse", "not separable at this size"


@dataclass(frozen=True)
class Interval:
    """A mean, its ``LEVEL`` interval [lo, hi], the items and seeds behind it, and (with several seeds) the
    standard deviation over seeds of each seed's mean. For a difference, ``seeds`` is A's and ``seeds_b`` B's."""

    mean: float
    lo: float
    hi: float
    items: int
    seeds: int = 1
    seed_sd: float | None = None
    seeds_b: int | None = None

    @property
    def bounded(self) -> bool:
        """Whether there is an interval (at least 2 items)."""
        return self.lo is not None and self.hi is not None and self.lo == self.lo and self.hi == self.hi

    def as_dict(self) -> dict:
        """The fields for JSON: no interval is ``lo``/``hi`` None (JSON has no NaN); unset optional fields left out."""
        fields = {k: v for k, v in asdict(self).items() if v is not None}
        return {**fields, "lo": self.lo if self.bounded else None, "hi": self.hi if self.bounded else None}

    def text(self, spec: str = ".1f") -> str:
        """``31.2 [12.5, 50.0]`` (``spec`` formats all three); ``[–]`` where there is no interval."""
        return f"{self.mean:{spec}} " + (f"[{self.lo:{spec}}, {self.hi:{spec}}]" if self.bounded else "[–]")

    def map(self, fn) -> "Interval":
        """The same interval on another scale through a monotone increasing ``fn`` (mean NLL -> perplexity): a
        percentile interval maps bound by bound."""
        return Interval(fn(self.mean), fn(self.lo), fn(self.hi), self.items, self.seeds, None, self.seeds_b)


def derived_seed(seed: int, *keys) -> int:
    """A seed for one of several independent bootstraps (one per task), stable across runs and processes."""
    return zlib.crc32(repr((seed, *keys)).encode())


def _matrix(scores, name: str = "scores") -> np.ndarray:
    """(seeds, items) float64; a 1-D array is one seed."""
    array = np.asarray(scores, dtype=np.float64)
    if array.ndim == 1:
        array = array[None, :]
    if array.ndim != 2 or array.shape[1] == 0 or array.shape[0] == 0:
        raise ValueError(f"{name} must be a non-empty (seeds, items) or (items,) array, got shape {array.shape}.")
    if not np.isfinite(array).all():
        raise ValueError(f"{name} hold a NaN or infinite value; every item needs a finite score.")
    return array


def _draw_means(scores: np.ndarray, idx: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """(r,) replicate means of ``scores`` (seeds, items) over the drawn items ``idx`` (r, items), each drawn item's
    seeds drawn again with replacement when there are several."""
    n_seeds = scores.shape[0]
    if n_seeds == 1:
        return scores[0][idx].mean(axis=1)
    seeds = rng.integers(n_seeds, size=(*idx.shape, n_seeds), dtype=np.int32)
    return scores[seeds, idx[..., None]].mean(axis=(1, 2))


def _replicates(sides: list[np.ndarray], resamples: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Replicate means of each of ``sides`` (seeds, items) over the same drawn items (a paired bootstrap)."""
    n = sides[0].shape[1]
    per = max(1, _CHUNK // (n * max(s.shape[0] for s in sides)))
    out: list[list[np.ndarray]] = [[] for _ in sides]
    for start in range(0, resamples, per):
        idx = rng.integers(n, size=(min(per, resamples - start), n), dtype=np.int32)
        for reps, side in zip(out, sides):
            reps.append(_draw_means(side, idx, rng))
    return [np.concatenate(reps) for reps in out]


def replicates(scores, *, resamples: int = RESAMPLES, seed: int = 0) -> np.ndarray:
    """The bootstrap's replicate means of ``scores`` ((items,) or (seeds, items)): what ``bootstrap_mean`` and
    ``two_level_bootstrap`` take percentiles of. Averaging several tasks' replicates gives their average's
    interval (the tasks' items are independent)."""
    return _replicates([_matrix(scores)], resamples, np.random.default_rng(seed))[0]


def percentile_interval(mean: float, reps: np.ndarray, items: int, level: float = LEVEL, **fields) -> Interval:
    """``mean`` with the central ``level`` percentiles of ``reps``; NaN bounds with fewer than 2 items."""
    if items < 2:
        return Interval(float(mean), math.nan, math.nan, items, **fields)
    lo, hi = np.percentile(reps, [50 * (1 - level), 50 * (1 + level)])
    return Interval(float(mean), float(lo), float(hi), items, **fields)


def seed_spread(scores) -> float | None:
    """Standard deviation over seeds of each seed's mean over items (None with one seed)."""
    array = _matrix(scores)
    return float(array.mean(axis=1).std(ddof=1)) if array.shape[0] > 1 else None


def bootstrap_mean(values, *, resamples: int = RESAMPLES, seed: int = 0, level: float = LEVEL) -> Interval:
    """The mean of ``values`` (one per item) with its percentile-bootstrap interval over items."""
    array = np.asarray(values, dtype=np.float64)
    if array.ndim != 1:
        raise ValueError(f"bootstrap_mean takes one value per item (a 1-D array), got shape {array.shape}.")
    return two_level_bootstrap(array[None, :], resamples=resamples, seed=seed, level=level)


def two_level_bootstrap(scores, *, resamples: int = RESAMPLES, seed: int = 0, level: float = LEVEL) -> Interval:
    """The mean of ``scores`` (seeds, items) with its two-level interval (items, then seeds within each item) and
    the seed-to-seed spread; with one seed, the bootstrap over items."""
    array = _matrix(scores)
    reps = replicates(array, resamples=resamples, seed=seed)
    return percentile_interval(array.mean(), reps, array.shape[1], level, seeds=array.shape[0],
                               seed_sd=seed_spread(array))


def paired_difference(a, b, *, resamples: int = RESAMPLES, seed: int = 0, level: float = LEVEL) -> Interval:
    """A − B over the same items: ``a`` and ``b`` are (items,) or (seeds, items), item j of both the same item.
    The items are drawn once for both sides; each side's seeds are drawn within each drawn item."""
    a, b = _matrix(a, "a"), _matrix(b, "b")
    if a.shape[1] != b.shape[1]:
        raise ValueError(f"a paired difference needs the same items on both sides, got {a.shape[1]} and "
                         f"{b.shape[1]} items.")
    reps_a, reps_b = _replicates([a, b], resamples, np.random.default_rng(seed))
    return percentile_interval(a.mean() - b.mean(), reps_a - reps_b, a.shape[1], level, seeds=a.shape[0],
                               seeds_b=b.shape[0])


def pooled_paired_difference(groups, *, resamples: int = RESAMPLES, seed: int = 0,
                             level: float = LEVEL) -> Interval:
    """A − B pooled over independent groups, each with its own paired items: ``groups`` is ``[(a, b), ...]``, one
    pair of (items,) arrays per group (a training seed, whose model answered its own validation set), item j of
    ``a`` and ``b`` the same item. The mean gives every group the same weight. A replicate draws the groups with
    replacement, then within each drawn group its items with replacement (once for both sides), and averages
    the drawn groups' mean differences: a nested (cluster) bootstrap, so the interval holds the group-to-group
    noise (the training seed's) as well as the items'. With few groups it is coarse (three groups give ten
    distinct draws of groups), so the reports show each group's difference beside it. ``seed_sd`` is the
    standard deviation over groups of each group's mean difference."""
    diffs = []
    for i, (a, b) in enumerate(groups):
        a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
        if a.ndim != 1 or a.shape != b.shape or a.size == 0:
            raise ValueError(f"group {i} needs the same non-empty items on both sides, got shapes {a.shape} and "
                             f"{b.shape}.")
        diffs.append(_matrix(a - b, f"group {i}")[0])
    if not diffs:
        raise ValueError("a pooled difference needs at least one group.")
    n = len(diffs)
    drawn = np.random.default_rng(seed).integers(n, size=(resamples, n))
    # each group's item-level replicate means (``replicates``, drawn in bounded chunks), one independent draw per
    # (replicate, slot), so that a group drawn twice in one replicate brings two independent resamples of its items
    per = np.stack([replicates(d, resamples=resamples * n, seed=derived_seed(seed, "group", i)).reshape(resamples, n)
                    for i, d in enumerate(diffs)])
    reps = per[drawn, np.arange(resamples)[:, None], np.arange(n)[None, :]].mean(axis=1)
    means = np.array([d.mean() for d in diffs])
    sd = float(means.std(ddof=1)) if n > 1 else None
    return percentile_interval(means.mean(), reps, sum(d.size for d in diffs), level, seeds=n, seed_sd=sd)


#: what a Headroom column means, in every table that has one
HEADROOM_NOTE = ("Headroom: the positive control, full attention against SWA on the row's own items at B's window "
                 "(and sink); yes where full attention is better, no where it is not: such a row cannot rank long-range "
                 "variants (each would tie or lose for want of anything to gain), whatever its verdict; – where the "
                 "run lacks the full-attention or the SWA result.")


def headroom(full_minus_swa: "Interval | None", lower_is_better: bool = False) -> bool | None:
    """The positive control from its paired interval, full attention − SWA: True where full attention is better,
    False where not, None where there is no such interval (a side missing)."""
    if full_minus_swa is None:
        return None
    return verdict(full_minus_swa.lo, full_minus_swa.hi, lower_is_better) == BETTER


def headroom_label(value: bool | None) -> str:
    return "–" if value is None else ("yes" if value else "no")


def verdict(lo: float | None, hi: float | None, lower_is_better: bool = False) -> str:
    """A − B worded from its interval: "better" when the whole interval lies on the good side of 0, "worse" when
    it lies on the bad side, else (0 inside, or no interval) "not separable at this size"."""
    if lo is None or hi is None or lo != lo or hi != hi:  # no interval: too few items
        return TIED
    if lo > 0:
        return WORSE if lower_is_better else BETTER
    if hi < 0:
        return BETTER if lower_is_better else WORSE
    return TIED
