"""The one home of the project's statistics: every interval, paired difference, verdict and equivalence test that
a table prints comes from here, by one of two schemes chosen by **the unit that varies**.

- **Items** (``scheme="items"``; a deterministic mode, or a stochastic one whose σ is drawn per input): the values
  are (items,) or (σ seeds, items). Each item's value is its mean over the σ seeds (σ is drawn from the seed, the
  layer and the row's own tokens, so one item's draws are independent of another's and the item mean carries σ's
  noise once); the items are drawn with replacement ``resamples`` times, and the interval is the percentile
  interval of the drawn means, widened about the mean by the small-sample factor sqrt(n / (n − 1)) ·
  t(n − 1) / z (a plain percentile bootstrap is too narrow by about that factor at a few dozen items). Redrawing
  σ seeds again inside each drawn item would count their noise twice; the σ spread is reported on its own
  (``seed_sd``: the SD over σ seeds of each seed's whole-task mean).
- **Training seeds** (``scheme="seeds"``; trained models): the values are (training seeds, items). A training seed
  moves every item of its model at once, so the unit resampled is the seed: each seed's mean over its items (or,
  for a difference, A's and B's models of the *same* seed, which share the initialisation and the data order) is
  one value, and the interval is a Student t interval over those per-seed values (df = seeds − 1). The items'
  noise is inside each seed's mean, so the interval holds both levels; redrawing a seed per item (what ``study
  pretrain`` once did) averages the seed-to-seed noise away and says "better" or "worse" about half the time
  when nothing differs.

**Fewer than 5 top-level units** (items, or seeds) give no 95% interval: the result is a ``range`` (the smallest and
largest unit value), printed as ``3 seeds: range [a, b]``, and its verdict is "too few seeds to decide" (or items).
Documents too few or too long to resample are cut into fixed-length segments first (``segments``).

**Equivalence.** "Not separable" is not "the same": with a margin δ, a difference is called ``equivalent within ±δ``
only by two one-sided tests at 5% each, that is when its 90% interval (same scheme) lies inside (−δ, +δ), and
(the **floor rule**, ``above_floor``, applied by ``utils.trained``) only where both arms beat the floor (SWA, or
chance) by more than δ; otherwise ``cannot_decide``: two arms that learn nothing are equal by construction. The
margin is fixed before the run, in the preset that decides.

**Skewed seeds.** Where the arms' seed SDs differ more than twofold (one arm tight, the other's seeds learning now
and then) and one seed can move the verdict (``fragile``), the per-seed differences are skewed and a t interval
calls a winner too often; the paired sign-flip (permutation) test over seeds is made beside it and both decide at
99% (``skewed_verdict``). Where a draw of seeds holds none of a skewed arm's rare seeds, nothing in the sample shows
the skew, and no test over so few seeds holds 5% (Tables 14c–d resampled: about 9%); a replication on fresh seeds
is the remedy there. The sign-flip test's level is exact wherever the arms' seeds are exchangeable, however skewed
or bimodal.

**Few documents, σ within them.** One σ draw shifts every segment of a document together, so where documents are
too few to resample and σ is drawn, the unit is the (σ seed, document) cluster (``paired_block_units``), not the
segment.

``tests/test_stats_calibration.py`` simulates crossed designs with no true effect and noise at each level (items,
σ seeds, training seeds) and checks that each scheme covers 95% within ±2 points and says better or worse about 5%
of the time; the item-level scheme applied to trained seeds fails it. A fixed ``seed`` makes every interval
reproducible.
"""
from __future__ import annotations

import dataclasses
import functools
import math
import zlib
from dataclasses import asdict, dataclass

import numpy as np

#: resamples per bootstrap interval
RESAMPLES = 2000
#: the interval's coverage
LEVEL = 0.95
#: the fewest top-level units (items, seeds) an interval is made from; fewer give a range
MIN_UNITS = 5
#: the sample SD's correction: every interval over seeds rests on it (0 would narrow them all, and the calibration
#: test catches it)
DDOF = 1
#: the schemes: which unit is resampled
SCHEMES = ("items", "seeds")
#: the most (resample, item) draws held at once; larger sets are drawn in chunks
_CHUNK = 4_000_000

BETTER, WORSE, TIED = "better", "worse", "not separable at this size"


def too_few(unit: str) -> str:
    """The verdict of a result with fewer than ``MIN_UNITS`` top-level units."""
    return f"too few {unit} to decide"


def equivalent(margin: float | str) -> str:
    """The verdict of two one-sided tests inside ±margin; a str margin is printed as given (with its unit, say)."""
    return f"equivalent within ±{margin if isinstance(margin, str) else format(margin, 'g')}"


@dataclass(frozen=True)
class Interval:
    """A mean and its ``LEVEL`` interval [lo, hi] by ``scheme``, with the counts behind it.

    ``form`` is ``interval``, ``range`` (fewer than ``MIN_UNITS`` top-level units: lo and hi are the smallest and
    largest unit values, not an interval) or ``none`` (a single unit). ``units`` counts the top-level units (items
    for the items scheme, seeds for the seeds scheme), ``items`` the items and ``seeds`` the seeds (A's; ``seeds_b``
    B's for a difference). ``seed_sd`` is the SD over seeds of each seed's mean (σ seeds for the items scheme,
    training seeds for the seeds scheme). ``lo90``/``hi90`` are the 90% interval of the equivalence test."""

    mean: float
    lo: float
    hi: float
    items: int
    seeds: int = 1
    seed_sd: float | None = None
    seeds_b: int | None = None
    scheme: str = "items"
    form: str = "interval"
    units: int | None = None
    lo90: float | None = None
    hi90: float | None = None

    @property
    def bounded(self) -> bool:
        """Whether there is a 95% interval (at least ``MIN_UNITS`` top-level units)."""
        return self.form == "interval" and None not in (self.lo, self.hi) and self.lo == self.lo and self.hi == self.hi

    @property
    def unit(self) -> str:
        return "seeds" if self.scheme == "seeds" else "items"

    def as_dict(self) -> dict:
        """The fields for JSON: no bound is None (JSON has no NaN); unset optional fields left out."""
        fields = {k: v for k, v in asdict(self).items() if v is not None}
        finite = self.form != "none" and self.lo == self.lo and self.hi == self.hi
        return {**fields, "lo": self.lo if finite else None, "hi": self.hi if finite else None}

    @classmethod
    def from_dict(cls, d: dict) -> "Interval":
        """An interval back from ``as_dict``'s JSON (missing bounds: NaN)."""
        known = {k: d[k] for k in cls.__dataclass_fields__ if d.get(k) is not None}
        return cls(**{**known, "lo": math.nan if d.get("lo") is None else d["lo"],
                      "hi": math.nan if d.get("hi") is None else d["hi"]})

    def text(self, spec: str = ".1f") -> str:
        """``31.2 [12.5, 50.0]``; ``31.2 (3 seeds: range [12.5, 50.0])`` with too few units; ``[–]`` with one."""
        from .report import fmt

        mean, lo, hi = fmt(self.mean, spec), fmt(self.lo, spec), fmt(self.hi, spec)
        if self.form == "range":
            return f"{mean} ({self.units} {self.unit}: range [{lo}, {hi}])"
        return f"{mean} " + (f"[{lo}, {hi}]" if self.bounded else "[–]")

    def verdict(self, lower_is_better: bool = False, margin: float | None = None) -> str:
        """A − B worded from the interval: better, worse, equivalent within ±margin (two one-sided tests, when a
        margin is given), not separable at this size, or too few units to decide."""
        if self.form != "interval":
            return too_few(self.unit)
        said = verdict(self.lo, self.hi, lower_is_better)
        if said == TIED and margin is not None and self.lo90 is not None and -margin < self.lo90 \
                and self.hi90 < margin:
            return equivalent(margin)
        return said

    def map(self, fn) -> "Interval":
        """The same interval on another scale through a monotone increasing ``fn`` (mean NLL -> perplexity)."""
        def f(x):
            return None if x is None else fn(x)
        return Interval(fn(self.mean), fn(self.lo), fn(self.hi), self.items, self.seeds, None, self.seeds_b,
                        self.scheme, self.form, self.units, f(self.lo90), f(self.hi90))


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


def _widening(n: int, level: float) -> float:
    """sqrt(n / (n − 1)) · t(n − 1) / z: how much too narrow a percentile bootstrap of a mean is at n units."""
    from scipy import stats

    q = 0.5 + level / 2
    return math.sqrt(n / (n - 1)) * float(stats.t.ppf(q, n - 1) / stats.norm.ppf(q))


def replicates(scores, *, resamples: int = RESAMPLES, seed: int = 0) -> np.ndarray:
    """The item bootstrap's replicate means of ``scores`` ((items,) or (σ seeds, items): each item its mean over
    the σ seeds). Averaging several tasks' replicates gives their average's replicates (independent items)."""
    values = _matrix(scores).mean(axis=0)
    rng, n = np.random.default_rng(seed), values.size
    per = max(1, _CHUNK // n)
    return np.concatenate([values[rng.integers(n, size=(min(per, resamples - s), n), dtype=np.int32)].mean(axis=1)
                           for s in range(0, resamples, per)])


def _few(mean: float, values: np.ndarray, **fields) -> Interval:
    """Fewer than ``MIN_UNITS`` units: a range over the unit values (none with one)."""
    form = "range" if values.size > 1 else "none"
    lo, hi = (float(values.min()), float(values.max())) if values.size > 1 else (math.nan, math.nan)
    return Interval(float(mean), lo, hi, form=form, units=int(values.size), **fields)


def percentile_interval(mean: float, reps: np.ndarray, items: int, level: float = LEVEL, values=None,
                        **fields) -> Interval:
    """``mean`` with the central ``level`` percentiles of the item bootstrap's ``reps``, widened about the mean by
    the small-sample factor (``_widening``), and the 90% interval of the equivalence test likewise. Fewer than
    ``MIN_UNITS`` items: the range of ``values`` (the item values) instead."""
    if items < MIN_UNITS:
        return _few(mean, np.asarray(values if values is not None else [], dtype=np.float64), items=items, **fields)
    bounds = []
    for lev in (level, 0.90):
        lo, hi = np.percentile(reps, [50 * (1 - lev), 50 * (1 + lev)])
        k = _widening(items, lev)
        bounds += [float(mean - k * (mean - lo)), float(mean + k * (hi - mean))]
    return Interval(float(mean), bounds[0], bounds[1], items, units=items, lo90=bounds[2], hi90=bounds[3], **fields)


@functools.lru_cache(maxsize=1024)
@functools.lru_cache(maxsize=4096)  # few distinct (level, seeds): fragility asks thousands of times
def _t_quantile(q: float, df: int) -> float:
    from scipy import stats

    return float(stats.t.ppf(q, df))


def t_interval(values, level: float = LEVEL, **fields) -> Interval:
    """The mean of ``values`` (one per top-level unit: a training seed) with its Student t interval; a range with
    fewer than ``MIN_UNITS``."""
    values = np.asarray(values, dtype=np.float64)
    mean, n = float(values.mean()), values.size
    if n < MIN_UNITS:
        return _few(mean, values, **fields)
    se = float(values.std(ddof=DDOF)) / math.sqrt(n)
    half, half90 = (_t_quantile(0.5 + lev / 2, n - 1) * se for lev in (level, 0.90))
    return Interval(mean, mean - half, mean + half, units=n, lo90=mean - half90, hi90=mean + half90, **fields)


def mean_of_tasks(tasks: list[tuple[float, np.ndarray, int, np.ndarray]], level: float = LEVEL) -> Interval:
    """The mean of several tasks' scores (an "Avg." column) with its interval, from each task's (mean, bootstrap
    ``replicates``, items, per-σ-seed means): the tasks' items are independent, so the mean of their replicates is
    a replicate of their mean. ``seed_sd`` is the SD over σ seeds of the mean of the tasks' per-seed scores, where
    every task has the same seeds."""
    means, reps, items, per_seed = zip(*tasks)
    counts = {len(p) for p in per_seed}
    avg = np.mean(per_seed, axis=0) if len(counts) == 1 else None
    return percentile_interval(float(np.mean(means)), np.mean(reps, axis=0), sum(items), level, seeds=max(counts),
                               seed_sd=float(avg.std(ddof=1)) if avg is not None and len(avg) > 1 else None)


def seed_spread(scores) -> float | None:
    """Standard deviation over seeds of each seed's mean over items (None with one seed)."""
    array = _matrix(scores)
    return float(array.mean(axis=1).std(ddof=1)) if array.shape[0] > 1 else None


def estimate(scores, scheme: str = "items", *, resamples: int = RESAMPLES, seed: int = 0,
             level: float = LEVEL) -> Interval:
    """The mean of ``scores`` ((items,) or (seeds, items)) with its interval by ``scheme`` (module docstring)."""
    array = _matrix(scores)
    fields = dict(items=array.shape[1], seeds=array.shape[0], seed_sd=seed_spread(array), scheme=_scheme(scheme))
    if scheme == "seeds":
        return t_interval(array.mean(axis=1), level, **fields)
    reps = replicates(array, resamples=resamples, seed=seed) if array.shape[1] >= MIN_UNITS else None
    fields.pop("items")
    return percentile_interval(array.mean(), reps, array.shape[1], level, values=array.mean(axis=0), **fields)


def difference(a, b, scheme: str = "items", *, resamples: int = RESAMPLES, seed: int = 0,
               level: float = LEVEL) -> Interval:
    """A − B by ``scheme``. Items: ``a`` and ``b`` (σ seeds, items) on the same items, paired item by item (the
    items drawn once for both sides; each side's σ seeds may differ in number). Seeds: ``a`` and ``b`` (training
    seeds, items), row s of both the same training seed, paired seed by seed (each seed's mean difference is one
    unit); the items of a seed may differ from another seed's (each model validated on its own draw)."""
    scheme = _scheme(scheme)
    if scheme == "seeds":
        rows_a, rows_b = _rows(a), _rows(b)
        if len(rows_a) != len(rows_b):
            raise ValueError(f"a difference over training seeds pairs seed by seed, got {len(rows_a)} seeds for A and "
                             f"{len(rows_b)} for B.")
        return seed_difference(list(zip(rows_a, rows_b)), level=level)
    a, b = _matrix(a, "a"), _matrix(b, "b")
    if a.shape[1] != b.shape[1]:
        raise ValueError(f"a paired difference needs the same items on both sides, got {a.shape[1]} and "
                         f"{b.shape[1]} items.")
    d = a.mean(axis=0) - b.mean(axis=0)
    reps = replicates(d, resamples=resamples, seed=seed) if d.size >= MIN_UNITS else None
    return percentile_interval(float(d.mean()), reps, d.size, level, values=d, seeds=a.shape[0],
                               seeds_b=b.shape[0], scheme="items")


def seed_difference(pairs, level: float = LEVEL) -> Interval:
    """A − B over training seeds: ``pairs`` is ``[(a, b), ...]``, one per seed, each the (items,) scores of A's and
    B's models of that seed on the same items. Each seed's mean difference is one unit; their mean with a t
    interval (a range under ``MIN_UNITS`` seeds). ``seed_sd`` is the SD of the per-seed differences."""
    diffs, items = [], 0
    for i, (a, b) in enumerate(pairs):
        a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
        if a.ndim != 1 or a.shape != b.shape or a.size == 0:
            raise ValueError(f"seed {i} needs the same non-empty items on both sides, got shapes {a.shape} and "
                             f"{b.shape}.")
        diffs.append(float(_matrix(a - b, f"seed {i}").mean()))
        items += a.size
    if not diffs:
        raise ValueError("a difference over training seeds needs at least one seed that trained both models.")
    sd = float(np.std(diffs, ddof=1)) if len(diffs) > 1 else None
    return t_interval(diffs, level, items=items, seeds=len(diffs), seeds_b=len(diffs), seed_sd=sd, scheme="seeds")


def per_seed(pairs) -> list[float]:
    """Each seed's mean difference (what ``seed_difference`` takes the interval of), for the reports."""
    return [float(np.mean(np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64))) for a, b in pairs]


def _rows(x) -> list[np.ndarray]:
    """A (seeds, items) array, or a list of per-seed item arrays of any lengths, as one array per seed."""
    return list(_matrix(x)) if isinstance(x, np.ndarray) else [np.asarray(r, dtype=np.float64) for r in x]


def _scheme(scheme: str) -> str:
    if scheme not in SCHEMES:
        raise ValueError(f"scheme must be one of {', '.join(SCHEMES)}, got {scheme!r}.")
    return scheme


def segments(tokens, length: int) -> np.ndarray:
    """Per-token values (documents, tokens) cut into consecutive segments, each one unit (its mean): a block
    bootstrap's units, for documents too few or too long to resample whole. A document of T tokens makes
    T // ``length`` segments that cover every token, their sizes within one token of each other: the units weigh
    nearly the same, and their mean is the mean over all tokens to within that difference. No last part is left
    out: the end of a document is where a window loses most."""
    tokens = np.asarray(tokens, dtype=np.float64)
    if tokens.ndim == 1:
        tokens = tokens[None, :]
    count = tokens.shape[-1] // length
    if count == 0:
        raise ValueError(f"segments of {length} tokens need documents of at least {length} tokens, got "
                         f"{tokens.shape[-1]}.")
    means = np.stack([part.mean(axis=-1) for part in np.array_split(tokens, count, axis=-1)], axis=-1)
    return means.reshape(*tokens.shape[:-2], -1)


#: the tokens of one unit of a block bootstrap, where a perplexity task has fewer than ``MIN_UNITS`` documents
SEGMENT = 64


def block_units(items, tokens=None, length: int = SEGMENT) -> np.ndarray:
    """The units an interval over documents resamples: ``items`` ((seeds, documents), each document's mean) when
    there are ``MIN_UNITS`` documents or more, or no per-token values; else ``tokens`` ((seeds, documents, tokens))
    cut into segments of ``length`` tokens (``segments``), where each document holds at least two. A percentile
    bootstrap over 2 or 3 documents is their [min, max] (51% or 73% coverage, not 95%). The segments are resampled
    as exchangeable units, so such an interval holds the variation within these documents, not from one document
    to another: it speaks for the text scored."""
    items = np.asarray(items, dtype=np.float64)
    if tokens is None or items.shape[-1] >= MIN_UNITS or np.shape(tokens)[-1] < 2 * length:
        return items
    return segments(tokens, length)


def paired_block_units(a_items, a_tokens, b_items, b_tokens, length: int = SEGMENT) -> tuple[np.ndarray, np.ndarray]:
    """``block_units`` of two sides on the same documents, shaped alike so that they pair unit by unit. Where
    documents are too few (under ``MIN_UNITS``) and a side draws σ (two or more σ seeds), the unit is the (σ seed,
    document) cluster: one σ draw shifts every segment of its document together, so segments resampled as
    independent would count σ's noise once per document instead of once per segment (7–18% false verdicts at a
    per-document shift of 0.025–0.05 nats; ``tests/test_stats_skewed.py`` holds both). A side with one σ seed (it draws
    nothing) stands beside each of the other's σ seeds; two sides with other counts pair their first seeds."""
    a_items, b_items = np.asarray(a_items, dtype=np.float64), np.asarray(b_items, dtype=np.float64)
    if a_tokens is None or b_tokens is None or a_items.shape[-1] >= MIN_UNITS:
        return block_units(a_items, a_tokens, length), block_units(b_items, b_tokens, length)
    ta, tb = (np.asarray(t, dtype=np.float64) for t in (a_tokens, b_tokens))
    ta, tb = (t[None] if t.ndim == 2 else t for t in (ta, tb))
    sa, sb = ta.shape[0], tb.shape[0]
    seeds = max(sa, sb) if 1 in (sa, sb) else min(sa, sb)
    if seeds < 2 or seeds * ta.shape[1] < MIN_UNITS:  # no σ noise to cluster, or too few clusters: segments
        return block_units(a_items, a_tokens, length), block_units(b_items, b_tokens, length)

    def clusters(t):
        rows = np.repeat(t, seeds, axis=0) if t.shape[0] == 1 else t[:seeds]
        return rows.mean(axis=-1).reshape(1, -1)  # one unit per (σ seed, document)

    return clusters(ta), clusters(tb)


def documents_difference(a_items, a_tokens, b_items, b_tokens, *, resamples: int = RESAMPLES, seed: int = 0,
                         level: float = LEVEL) -> Interval:
    """A − B on the same documents by the items scheme, over ``paired_block_units`` (documents, segments, or (σ
    seed, document) clusters); ``seeds`` and ``seeds_b`` count each side's σ seeds, whatever the unit."""
    a_units, b_units = paired_block_units(a_items, a_tokens, b_items, b_tokens)
    diff = difference(a_units, b_units, "items", resamples=resamples, seed=seed, level=level)
    return dataclasses.replace(diff, seeds=int(np.atleast_2d(a_items).shape[0]),
                               seeds_b=int(np.atleast_2d(b_items).shape[0]))


# ---- training seeds whose spreads differ: a paired sign-flip test ----------------------------------------
#: the arms' seed SDs differ by more than this factor: the per-seed differences may be skewed or bimodal (one arm
#: tight, the other's seeds learning now and then), where a t interval calls a winner 6–19% of the time under no
#: difference; such a comparison is decided by the paired sign-flip test as well
SPREAD_RATIO = 2.0
#: exact enumeration of the 2**n sign patterns up to this many seeds; a fixed random set of patterns beyond
_EXACT_FLIPS = 16
_RANDOM_FLIPS = 1 << 16


@functools.lru_cache(maxsize=32)
def _signs(n: int) -> np.ndarray:
    if n <= _EXACT_FLIPS:
        codes = np.arange(1 << n, dtype=np.int64)[:, None] >> np.arange(n)
        return 1.0 - 2.0 * (codes & 1)
    rng = np.random.default_rng(n)
    flips = rng.choice([-1.0, 1.0], size=(_RANDOM_FLIPS, n))
    flips[0] = 1.0  # the observed assignment is one of the patterns
    return flips


def sign_flip_p(diffs, null: float = 0.0) -> float:
    """Two-sided p of the paired sign-flip (permutation) test that the per-seed differences are centred on ``null``:
    the share of sign patterns whose mean is at least as far from 0 as the observed one. Exact (all 2**n patterns)
    up to 16 seeds. Its level holds for any symmetric spread of the differences, bimodal or heavy-tailed; at n
    seeds its smallest p is 2 / 2**n (0.0625 at 5 seeds: five seeds never decide alone)."""
    d = np.asarray(diffs, dtype=np.float64) - null
    signs = _signs(d.size)
    means = np.abs(signs @ d) / d.size
    return float(np.mean(means >= abs(d.mean()) - 1e-12 * (1 + np.abs(d).max())))


def sign_flip_interval(diffs, level: float = LEVEL) -> tuple[float, float]:
    """The values δ that the sign-flip test at 1 − ``level`` does not reject (the test inverted, by bisection on
    each side of the mean); (nan, nan) where no value is rejected (too few seeds: 2 / 2**n > 1 − level)."""
    d = np.asarray(diffs, dtype=np.float64)
    alpha, mean = 1 - level, float(d.mean())
    if 2.0 / 2 ** min(d.size, 62) > alpha:
        return math.nan, math.nan
    span = float(d.max() - d.min()) or 1.0
    bounds = []
    for far in (float(d.min()) - span, float(d.max()) + span):  # rejected there: every difference on one side
        inside, outside = mean, far
        for _ in range(40):
            mid = (inside + outside) / 2
            inside, outside = (mid, outside) if sign_flip_p(d, mid) > alpha else (inside, mid)
        bounds.append(inside)
    return bounds[0], bounds[1]


def fragile(diffs, lower_is_better: bool = False, margin: float | None = None) -> bool:
    """Whether one seed can move the t interval's verdict: a seed's own difference lies on the other side of zero
    from a better or worse, or leaving any one seed out (with five or more left) words it otherwise. A verdict that
    every seed bears out (a positive control, full attention far ahead at every seed) is not fragile, however the
    arms' spreads differ."""
    d = np.asarray(diffs, dtype=np.float64)
    said = t_interval(d, items=d.size).verdict(lower_is_better, margin)
    if said in (BETTER, WORSE) and np.any(np.sign(d) != np.sign(d.mean())):
        return True
    return d.size > MIN_UNITS and any(
        t_interval(np.delete(d, i), items=d.size - 1).verdict(lower_is_better, margin) != said for i in range(d.size))


def spreads_differ(a_means, b_means) -> bool:
    """The two arms' seed SDs differ by more than ``SPREAD_RATIO`` (each over its seeds' means)."""
    sa, sb = (float(np.std(np.asarray(x, dtype=np.float64), ddof=1)) if len(x) > 1 else 0.0 for x in (a_means, b_means))
    small, large = sorted((sa, sb))
    return large > SPREAD_RATIO * small if large > 0 else False


# ---- the floor rule --------------------------------------------------------------------------------------
def cannot_decide(margin: float | str, missing_floor: str | None = None) -> str:
    """The verdict where an equivalence would sit at the floor: an arm does not beat SWA (or chance) by more than
    the margin, so two arms that learn nothing would be "equivalent" by construction. ``missing_floor`` (the floor's
    name, "" if none is known): the floor was not trained with the arms' seeds, so the verdict says so rather than
    blame the arms."""
    shown = margin if isinstance(margin, str) else format(margin, "g")
    if missing_floor is not None:
        return (f"cannot decide: the floor ({missing_floor or 'SWA'}) was not trained with these seeds, so nothing "
                f"shows that the arms use their routes (each must beat it by more than ±{shown}); train it too")
    return f"cannot decide: the arms do not use their routes (each must beat the floor by more than ±{shown})"


def above_floor(gain: "Interval | None", margin: float, lower_is_better: bool = False) -> bool:
    """An arm's gain over the floor (arm − SWA, or − chance) clears the margin: its whole 95% interval lies beyond
    ``margin`` on the good side. False without an interval (no floor measured, or too few units)."""
    if gain is None or not gain.bounded:
        return False
    return gain.hi < -margin if lower_is_better else gain.lo > margin


# ---- the earlier names, each one scheme ------------------------------------------------------------------
def bootstrap_mean(values, *, resamples: int = RESAMPLES, seed: int = 0, level: float = LEVEL) -> Interval:
    """The mean of ``values`` (one per item) with its interval over items."""
    array = np.asarray(values, dtype=np.float64)
    if array.ndim != 1:
        raise ValueError(f"bootstrap_mean takes one value per item (a 1-D array), got shape {array.shape}.")
    return estimate(array, "items", resamples=resamples, seed=seed, level=level)


def two_level_bootstrap(scores, *, resamples: int = RESAMPLES, seed: int = 0, level: float = LEVEL) -> Interval:
    """The mean of ``scores`` (σ seeds, items) by the items scheme, with the σ-seed spread."""
    return estimate(scores, "items", resamples=resamples, seed=seed, level=level)


def paired_difference(a, b, *, resamples: int = RESAMPLES, seed: int = 0, level: float = LEVEL) -> Interval:
    """A − B over the same items ((items,) or (σ seeds, items) each), by the items scheme."""
    return difference(a, b, "items", resamples=resamples, seed=seed, level=level)


def pooled_paired_difference(groups, *, resamples: int = RESAMPLES, seed: int = 0,
                             level: float = LEVEL) -> Interval:
    """A − B over training seeds, each with its own paired items: ``seed_difference``."""
    return seed_difference(groups, level=level)


#: what a Headroom column means, in every table that has one
HEADROOM_NOTE = ("Headroom: the positive control, full attention against SWA on the row's own items at B's window "
                 "(and sink); yes where full attention is better, no where it is not: such a row cannot rank long-range "
                 "variants (each would tie or lose for want of anything to gain), whatever its verdict; – where the "
                 "run lacks the full-attention or the SWA result, or has too few units for the control's interval.")


def headroom(full_minus_swa: "Interval | None", lower_is_better: bool = False) -> bool | None:
    """The positive control from its paired interval, full attention − SWA: True where full attention is better,
    False where not, None where there is no such interval (a side missing)."""
    if full_minus_swa is None or full_minus_swa.form != "interval":  # too few units: the control is not known
        return None
    return full_minus_swa.verdict(lower_is_better) == BETTER


def headroom_label(value: bool | None) -> str:
    return "–" if value is None else ("yes" if value else "no")


def verdict(lo: float | None, hi: float | None, lower_is_better: bool = False) -> str:
    """A − B worded from a 95% interval: "better" when the whole interval lies on the good side of 0, "worse" when
    it lies on the bad side, else (0 inside, or no interval) "not separable at this size". A range is not an
    interval: word it with ``Interval.verdict``."""
    if lo is None or hi is None or lo != lo or hi != hi:  # no interval: too few items
        return TIED
    if lo > 0:
        return WORSE if lower_is_better else BETTER
    if hi < 0:
        return BETTER if lower_is_better else WORSE
    return TIED


def comparison_row(diff: Interval, lower_is_better: bool = False, margin: float | None = None, **fields) -> dict:
    """One comparison's row for JSON and the tables: ``fields`` (a, b, column, ...), the interval, its verdict."""
    return {**fields, **diff.as_dict(), "verdict": diff.verdict(lower_is_better, margin)}


#: where the arms' spreads differ, better or worse is decided at this level (by the t interval, and by the sign-flip
#: test beside it where one seed can move the verdict), and under ``FEW_SEEDS`` seeds always. The false verdicts this
#: rule gives, resampling the project's own per-seed values with no difference in the means
#: (``tests/test_stats_calibration.py``, 400 draws each, ±1.2 points):
#: - Tables 14c–d (one arm tight, the other's seeds learning now and then): 2–4% at 5–10 seeds, where the t interval
#:   alone at 95% gave 8–12%; 6.8% at 16 seeds, above the project's 6%: the differences are skewed to one side, and
#:   neither the t interval nor the sign-flip test (which needs symmetric differences) holds its level there;
#: - Table 11b's SA and Random (pass-key, log p and accuracy; exchangeable or each its own spread): at most 6% at
#:   8–16 seeds.
#: An arm whose seeds learn rarely enough that a draw of eight to twelve holds none of them (simulated: one time in
#: ten) is called better or worse 8–18% of the time: nothing in such a sample shows the skew, and no test of a mean
#: over so few seeds holds its level there; the reports' "seeds that learned" column is what shows it.
SKEWED_LEVEL = 0.99
#: under this many training seeds a better or worse needs the t interval at ``SKEWED_LEVEL`` (the 95% interval is
#: still the one shown): at 95% a draw of five to ten seeds of an arm that learns now and then, holding none of its
#: rare seeds, is called better or worse 8–12% of the time (Table 14c's gated "better" over five seeds did not
#: replicate, Table 14d)
FEW_SEEDS = 16
#: the ``test`` of a verdict that the t interval and the sign-flip test gave together
SKEWED_TEST = f"t and sign-flip at {SKEWED_LEVEL:.0%} (the arms' spreads differ)"


def skewed_verdict(diffs, lower_is_better: bool = False, margin: float | None = None) -> str:
    """The verdict of per-seed differences whose arms' spreads differ: better or worse only where the t interval and
    the sign-flip test both say so at ``SKEWED_LEVEL``; equivalent only where both intervals at 1 − 2(1 −
    ``SKEWED_LEVEL``) (two one-sided tests at 1% each) lie inside ±margin; "too few seeds to decide" where the
    sign-flip test cannot reach that level (under 8 seeds: its smallest p is 2 / 2**n)."""
    d = np.asarray(diffs, dtype=np.float64)
    if 2.0 / 2 ** min(d.size, 62) >= 1 - SKEWED_LEVEL:
        return too_few("seeds")

    said = t_interval(d, SKEWED_LEVEL, items=d.size).verdict(lower_is_better)
    if said in (BETTER, WORSE):  # the sign-flip test must reject too (its interval then excludes 0 on that side)
        return said if sign_flip_p(d) < 1 - SKEWED_LEVEL else TIED
    if margin is not None:
        level = 1 - 2 * (1 - SKEWED_LEVEL)
        t, (f_lo, f_hi) = t_interval(d, level, items=d.size), sign_flip_interval(d, level)
        lo, hi = min(t.lo, f_lo), max(t.hi, f_hi)
        if -margin < lo and hi < margin:
            return equivalent(margin)
    return said


def seed_comparison(pairs: dict, lower_is_better: bool = False, margin: float | None = None, **fields) -> dict:
    """A − B over training seeds, as one comparison row: ``pairs`` is {training seed: (A's items, B's items)},
    A's and B's models of one seed scored on the same items. The row holds the interval over seeds
    (``seed_difference``), its verdict, and ``per_seed``: each seed's own mean difference, which every report
    shows beside the interval. The verdict is ``_seed_rule``'s: better or worse at ``SKEWED_LEVEL`` under
    ``FEW_SEEDS`` seeds or where the arms' seed SDs differ by more than ``SPREAD_RATIO`` (one arm tight, the other's
    seeds learning now and then), there with the paired sign-flip test beside the t interval where one seed can move
    the verdict (``sign_flip``: its interval and p); "equivalent" only from ``FEW_SEEDS`` seeds. ``test`` names what
    decided, and a better, worse or equivalent carries its ``fragility``. The one place a trained comparison is
    made, for every study."""
    seeds = list(pairs)
    values = [pairs[s] for s in seeds]
    diff = seed_difference(values)
    diffs = per_seed(values)
    row = comparison_row(diff, lower_is_better, margin, **fields, per_seed=dict(zip(seeds, diffs)))
    means = np.array([(float(np.mean(a)), float(np.mean(b))) for a, b in values])
    said, test = _seed_rule(np.asarray(diffs), means, lower_is_better, margin)
    row.update(verdict=said, test=test)
    if test == SKEWED_TEST:
        lo, hi = sign_flip_interval(diffs, SKEWED_LEVEL)
        row["sign_flip"] = {"p": sign_flip_p(diffs), "level": SKEWED_LEVEL, "lo": None if lo != lo else lo,
                            "hi": None if hi != hi else hi}
    if said in (BETTER, WORSE) or said.startswith("equivalent"):
        row["fragility"] = fragility(diffs, means, lower_is_better, margin)
    return row


def _seed_test(diffs: np.ndarray, means: np.ndarray, lower_is_better: bool, margin: float | None) -> tuple[str, str]:
    """``_seed_rule`` before its floor on an equivalence's seeds."""
    differ = diffs.size >= MIN_UNITS and spreads_differ(means[:, 0], means[:, 1])
    if differ and fragile(diffs, lower_is_better, margin):
        return skewed_verdict(diffs, lower_is_better, margin), SKEWED_TEST
    if differ or MIN_UNITS <= diffs.size < FEW_SEEDS:
        said = t_interval(diffs, SKEWED_LEVEL, items=diffs.size, scheme="seeds").verdict(lower_is_better, margin)
        why = "the arms' spreads differ" if differ else f"under {FEW_SEEDS} seeds"
        return said, f"t at {SKEWED_LEVEL:.0%} ({why})"
    return t_interval(diffs, items=diffs.size, scheme="seeds").verdict(lower_is_better, margin), "t"


def _seed_rule(diffs: np.ndarray, means: np.ndarray, lower_is_better: bool, margin: float | None) -> tuple[str, str]:
    """(verdict, what decided) of per-seed differences and each seed's (A, B) means: the rule ``seed_comparison``
    runs, and ``fragility`` reruns on fewer seeds. "Equivalent" needs ``FEW_SEEDS`` seeds: under that the two
    one-sided tests at 90% said "equivalent" 8% of the time at 10 seeds where the true difference was the margin
    (Table 11b's pass-key seeds resampled, ``tests/test_stats_calibration.py``); at 16 and 26 seeds under 5%."""
    said, test = _seed_test(diffs, means, lower_is_better, margin)
    if said.startswith("equivalent") and diffs.size < FEW_SEEDS:
        return TIED, f"{test}; an equivalence needs {FEW_SEEDS} seeds"
    return said, test


def fragility(diffs, means=None, lower_is_better: bool = False, margin: float | None = None) -> dict:
    """How much a verdict over training seeds rests on single seeds: ``fewest``, the fewest seeds whose removal words
    it otherwise (searched exactly over every seed, and every pair of seeds up to 20 seeds, then by leaving out the
    most extreme or the most central seeds: ``exact`` says which; None where no removal that leaves ``MIN_UNITS``
    seeds changes it), and the leave-one-out ranges of the mean (``loo_mean``) and of the 90% interval's bounds
    (``loo90``).
    ``means``: each seed's (A, B) means, for the rule's spread check (None: the t interval alone)."""
    d = np.asarray(diffs, dtype=np.float64)
    m = np.zeros((d.size, 2)) if means is None else np.asarray(means, dtype=np.float64)

    def said(keep) -> str:
        return _seed_rule(d[keep], m[keep], lower_is_better, margin)[0]

    everything = np.arange(d.size)
    verdict_ = said(everything)
    loo = [np.delete(everything, i) for i in range(d.size)]
    loo_t = [t_interval(d[k], items=k.size) for k in loo] if d.size > MIN_UNITS else []
    out = {"verdict": verdict_, "fewest": None, "exact": True,
           "loo_mean": [float(min(d[k].mean() for k in loo)), float(max(d[k].mean() for k in loo))] if loo else None,
           "loo90": [float(min(t.lo90 for t in loo_t)), float(max(t.hi90 for t in loo_t))] if loo_t else None}
    room = d.size - MIN_UNITS
    if room >= 1 and any(said(k) != verdict_ for k in loo):
        return {**out, "fewest": 1}
    if room >= 2 and d.size <= 20 and any(said(np.delete(everything, [i, j])) != verdict_
                                         for i in range(d.size) for j in range(i + 1, d.size)):
        return {**out, "fewest": 2}
    order = np.argsort(d)
    centre = np.argsort(np.abs(d - np.median(d)))
    for k in range(3, room + 1):
        for drop in (order[:k], order[-k:], centre[:k]):
            if said(np.setdiff1d(everything, drop)) != verdict_:
                return {**out, "fewest": k, "exact": False}
    return {**out, "exact": room <= 1 or (room == 2 and d.size <= 20)}
