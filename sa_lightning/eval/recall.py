"""A recall record: a synthetic-recall model's answers by key–query distance, read beyond SWA's receptive field.

A record (``lit.items.score_recall``, what ``study long-range`` keeps per cell) holds, per K permutations averaged
at validation, ``scores[K]``: ``acc``, ``loss``, ``buckets`` (accuracy per distance bucket ``"lo-hi"``), ``items``
(each answer in validation order as ``[distance, 1 right / 0 wrong]``, a mean where it was validated under several
σ seeds), ``logps`` (each answer's log-probability, in the same order) and, under several σ seeds,
``hits_by_eval_seed``; beside them the cell's ``receptive_field`` L·(w−1) and its learning ``curve``. Everything
here reads those fields: it draws nothing and trains nothing.
"""
from __future__ import annotations

import math
import statistics
from pathlib import Path

#: accuracy beyond the field at which a model has learned the task
TARGET = 0.9


def mean_of_runs(runs: list[dict]) -> dict:
    """One K's scores from its validations under several σ seeds: each number and each answer their mean (the
    validation set, so the answers' distances, is the same in every run), each run's answers kept."""
    if len(runs) == 1:
        return runs[0]
    mean = statistics.fmean
    return {"acc": mean(r["acc"] for r in runs), "loss": mean(r["loss"] for r in runs),
            "buckets": {name: mean(r["buckets"][name] for r in runs) for name in runs[0]["buckets"]},
            "items": [[d, round(mean(r["items"][j][1] for r in runs), 6)]
                      for j, (d, _) in enumerate(runs[0]["items"])],
            "logps": [round(mean(values), 5) for values in zip(*(r.get("logps") or [] for r in runs))],
            "hits_by_eval_seed": [[hit for _, hit in r["items"]] for r in runs]}


def learning_curve(log_dir: Path, far_buckets: list[str]) -> list[list[float]]:
    """``[[step, accuracy beyond SWA's field], ...]`` from the validations during training (``val/acc@<bucket>``, the
    mean over the buckets wholly beyond the field), every version of the cell's log merged by step: what
    ``learned_step`` reads."""
    from ..utils.tensorboard import scalars

    by_step = scalars(log_dir, [f"val/acc@{name}" for name in far_buckets])
    return [[step, round(sum(accs.values()) / len(accs), 4)] for step, accs in sorted(by_step.items())
            if len(accs) == len(far_buckets)]


def learned_step(record: dict, target: float = TARGET) -> int | None:
    """The first validation step at which the cell's accuracy beyond SWA's field reached ``target``, or None."""
    return next((step for step, acc in record.get("curve") or [] if acc >= target), None)


def bucket_bounds(name: str) -> tuple[int, int]:
    lo, hi = name.split("-")
    return int(lo), int(hi)


def far_buckets(names, receptive_field: int) -> list[str]:
    """The buckets lying wholly beyond SWA's receptive field."""
    return [name for name in names if bucket_bounds(name)[0] > receptive_field]


def beyond_from(record: dict) -> int | None:
    """The shortest distance of the buckets lying wholly beyond SWA's receptive field L * (w - 1)."""
    starts = [bucket_bounds(name)[0] for name in next(iter(record["scores"].values()))["buckets"]]
    beyond_rf = [lo for lo in starts if lo > record["receptive_field"]]
    return min(beyond_rf) if beyond_rf else None


def beyond_items(record: dict, k: int) -> list[int] | None:
    """The answers (1 right, 0 wrong) whose key-query distance lies in a bucket wholly beyond SWA's receptive
    field, in validation order; None for a cell saved without its answers."""
    items = record["scores"][k].get("items")
    start = beyond_from(record)
    if items is None or start is None:
        return None
    return [hit for distance, hit in items if distance >= start]


def beyond_logps(record: dict, k: int) -> list[float] | None:
    """The log-probability of each answer beyond SWA's field at K (``beyond_items``' answers), or None for a cell
    saved without them."""
    score, start = record["scores"][k], beyond_from(record)
    logps, items = score.get("logps"), score.get("items")
    if not logps or not items or len(logps) != len(items) or start is None:
        return None
    return [lp for (distance, _), lp in zip(items, logps) if distance >= start]


def beyond_by_eval_seed(record: dict, k: int) -> list[float] | None:
    """Accuracy beyond SWA's receptive field under each σ seed the cell was validated under at K, or None where it
    was validated once."""
    score, start = record["scores"][k], beyond_from(record)
    runs = score.get("hits_by_eval_seed")
    if not runs or len(runs) < 2 or start is None or not score.get("items"):
        return None
    far = [j for j, (distance, _) in enumerate(score["items"]) if distance >= start]
    return [sum(hits[j] for j in far) / len(far) for hits in runs] if far else None


def sigma_sd(record: dict, k: int) -> float | None:
    """The σ seeds' spread: the standard deviation of the cell's accuracy beyond SWA's field at K over the evaluation
    σ seeds it was validated under; None where it was validated once."""
    per_seed = beyond_by_eval_seed(record, k)
    return None if per_seed is None else statistics.stdev(per_seed)


def beyond(record: dict, k: int) -> float:
    """Accuracy beyond SWA's receptive field L * (w - 1): the share of right answers over the buckets lying
    wholly beyond it (a cell saved without its answers: the mean of those buckets' accuracies)."""
    items = beyond_items(record, k)
    if items:
        return sum(items) / len(items)
    buckets = record["scores"][k]["buckets"]
    accs = [buckets[name] for name in far_buckets(buckets, record["receptive_field"]) if not math.isnan(buckets[name])]
    return sum(accs) / len(accs) if accs else math.nan


def beyond_interval(record: dict, k: int):
    """``beyond`` with its 95% interval (``utils.stats.bootstrap_mean`` over the answers), or None."""
    from ..utils.stats import bootstrap_mean, derived_seed

    items = beyond_items(record, k)
    seed = derived_seed(0, *(record[key] for key in ("task", "variant", "depth", "window", "seed")), k)
    return bootstrap_mean(items, seed=seed) if items and len(items) > 1 else None
