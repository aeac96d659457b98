"""A recall record: a synthetic-recall model's answers by key–query distance, read beyond SWA's receptive field.

A record (``lit.items.score_recall``, what ``study long-range`` keeps per cell) holds, per K permutations averaged
at validation, ``scores[K]``: ``acc``, ``loss``, ``buckets`` (accuracy per distance bucket ``"lo-hi"``), ``items``
(each answer in validation order as ``[distance, 1 right / 0 wrong]``, a mean where it was validated under several
σ seeds), ``logps`` (each answer's log-probability, in the same order) and, under several σ seeds,
``hits_by_eval_seed``; beside them the cell's ``receptive_field`` L·(w−1) and its learning ``curve``. Everything
here reads those fields, and trains or validates nothing: the answers beyond the field (with their bootstrap
interval, ``utils.stats``), each arm's answers per training seed (``answers``), a run's per-cell table and CSV rows
(``table``, ``rows``) and its figure of accuracy by distance (``plot``).
"""
from __future__ import annotations

import math
import statistics
from pathlib import Path

from ..attention import VARIANTS, get_variant, variant_names
from ..utils import trained
from ..utils.report import head, number, ranked_cells, row

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


# ---- a run's records: each arm's answers per training seed, a row per cell, the figure by distance ----------
def answers(records: list[dict], k: int, outcome: str) -> dict[tuple, dict]:
    """Per setting (task, L, w): each variant's items beyond SWA's field at K (B's at 1 where it draws nothing),
    per training seed, for ``outcome`` (``acc``: 1 right, 0 wrong; ``logp``). A seed's variants share their
    validation answers (the data seed is the training seed); a cell validated on other answers is left out."""
    out: dict[tuple, dict] = {}
    reference: dict[tuple, list] = {}
    for r in sorted(records, key=lambda r: (r["task"], r["depth"], r["window"], r["seed"], r["variant"])):
        kk = k if k in r["scores"] else 1
        if kk not in r["scores"] or not r["scores"][kk].get("items"):
            continue
        values = beyond_items(r, kk) if outcome == "acc" else beyond_logps(r, kk)
        distances = [d for d, _ in r["scores"][kk]["items"]]
        key = (r["task"], r["depth"], r["window"], r["seed"])
        if values is None or not values or reference.setdefault(key, distances) != distances:
            continue
        out.setdefault(key[:3], {}).setdefault(r["variant"], {})[r["seed"]] = [float(v) for v in values]
    return out


def rows(records: list[dict]) -> list[dict]:
    """One flat row per (cell, K) for ``results.csv``."""
    out = []
    for r in records:
        for k, s in sorted(r["scores"].items()):
            flat = {key: r[key] for key in ("task", "variant", "depth", "window", "seed", "seq_len", "receptive_field",
                                            "steps", "train_seconds")}
            ci = beyond_interval(r, k)
            flat.update(eval_samples=k, acc=round(s["acc"], 4), acc_beyond_rf=round(beyond(r, k), 4),
                        loss=round(s["loss"], 4))
            sd = sigma_sd(r, k)
            flat.update(acc_beyond_rf_sigma_sd=None if sd is None else round(sd, 4),
                        eval_seeds=len(s.get("hits_by_eval_seed") or [None]))
            flat.update(acc_beyond_rf_lo=None if ci is None else round(ci.lo, 4),
                        acc_beyond_rf_hi=None if ci is None else round(ci.hi, 4),
                        answers_beyond_rf=None if ci is None else ci.items)
            flat.update({f"acc@{name}": round(a, 4) for name, a in s["buckets"].items()})
            out.append(flat)
    return out


def several_seeds(records: list[dict]) -> bool:
    """Whether the study trained more than one seed: then its tables name each row's seed."""
    return len({r["seed"] for r in records}) > 1


def table(records: list[dict], flat: list[dict] | None = None) -> str:
    """Accuracy (%) per distance bucket; rows (task, L, w, variant, K); best **bold** per group and column. ``flat``:
    the records' ``rows`` where the caller made them already (each holds a bootstrap interval per cell and K)."""
    flat = rows(records) if flat is None else flat
    if not flat:
        return ""
    buckets = [c for c in flat[0] if c.startswith("acc@")]
    cols = ["acc", "acc_beyond_rf", *buckets]
    seeded = several_seeds(records)
    sigma = any(r["acc_beyond_rf_sigma_sd"] is not None for r in flat)
    names = ["task", "L", "w", "L·(w−1)", "variant", *(["seed"] if seeded else []), "K", "all", "beyond L·(w−1)",
             *(["σ SD"] if sigma else []), *(c[4:] for c in buckets)]
    lines = head(names, ["---"] * (7 if seeded else 6) + ["---:"] * (len(names) - (7 if seeded else 6)))
    groups: dict[tuple, list[dict]] = {}
    for r in flat:
        groups.setdefault((r["task"], r["depth"], r["window"]), []).append(r)
    for (task, depth, window), group in groups.items():
        marked = [ranked_cells([r[c] for r in group], [_percent(r, c) for r in group], top=1, rank_alone=True)
                  for c in cols]
        for i, r in enumerate(group):
            sd = r["acc_beyond_rf_sigma_sd"]
            spread = ["–" if sd is None else f"{100 * sd:.1f} ({r['eval_seeds']} σ)"] if sigma else []
            lines.append(row([task, depth, window, r["receptive_field"], r["variant"], *([r["seed"]] if seeded else []),
                              r["eval_samples"], marked[0][i], marked[1][i], *spread,
                              *(column[i] for column in marked[2:])]))
    if any(r.get("acc_beyond_rf_lo") is not None for r in flat):
        lines += ["", TABLE_NOTE]
    if sigma:
        lines += ["", SIGMA_NOTE]
    return "\n".join(lines) + "\n"


def _percent(r: dict, col: str) -> str:
    """A cell in %, beyond-RF accuracy with its 95% interval where the answers were kept."""
    text = number(100 * r[col], ".1f")
    if col == "acc_beyond_rf" and r.get("acc_beyond_rf_lo") is not None:
        text += f" [{100 * r['acc_beyond_rf_lo']:.1f}, {100 * r['acc_beyond_rf_hi']:.1f}]"
    return text


SIGMA_NOTE = ("σ SD: the standard deviation, over the evaluation σ seeds (`eval_seeds`), of the accuracy "
              "beyond L·(w−1) of a model that draws, validated at K = 1 once per seed; its row's numbers count each "
              "answer as its mean over those seeds. Larger K average K draws of the first seed.")
TABLE_NOTE = ("beyond L·(w−1): the share of right answers whose key–query distance lies in a bucket wholly beyond "
              "SWA's receptive field, with its 95% interval (a percentile bootstrap over those answers, 2000 "
              "resamples; one trained model, so it holds the validation set's noise, not the training seed's; at "
              "K = 1 a model that draws counts each answer as its mean over the evaluation σ seeds).")


def plot(records: list[dict], path: Path) -> None:
    """``accuracy_vs_distance.png``: one panel per (task, L, w), accuracy per distance bucket of each variant over
    its training seeds (``utils.trained.profile``: the mean, its interval over the seeds, the series side by side),
    full attention as the band under the rest, SWA's receptive field L·(w−1) as a dashed line, and each model that
    draws averaged over its largest K permutations beside it (hollow, dotted)."""
    order = sorted(VARIANTS, key=lambda v: (VARIANTS[v].sparse, variant_names().index(v)))  # the reference first
    groups: dict[tuple, dict[tuple, list[dict]]] = {}
    for r in records:
        for k in r["scores"]:
            groups.setdefault((r["task"], r["depth"], r["window"]), {}).setdefault((r["variant"], k), []).append(r)
    panels = []
    for (task, depth, window), by_arm in sorted(groups.items()):
        series = []
        largest = {v: max(k for vv, k in by_arm if vv == v) for v, _ in by_arm}
        for (variant, k), cells_ in sorted(by_arm.items(), key=lambda kv: (order.index(kv[0][0]), kv[0][1])):
            spec = get_variant(variant)
            buckets = list(cells_[0]["scores"][k]["buckets"])
            if k > 1 and (not spec.sparse or k != largest[variant]):  # K = 1 and the largest K of each model
                continue
            series.append({"label": spec.label + (f" (K={k})" if k > 1 else ""), "color": spec.color,
                           "marker": spec.marker, "reference": not spec.sparse, "dotted": k > 1,
                           "x": [sum(bucket_bounds(b)) / 2 for b in buckets],
                           "per_seed": [[r["scores"][k]["buckets"].get(b, math.nan) for b in buckets] for r in cells_]})
        fewest, most = min(len(c) for c in by_arm.values()), max(len(c) for c in by_arm.values())
        seeds = f"{most} training seed{'s' * (most > 1)}" if fewest == most else f"{fewest}–{most} training seeds"
        rf = depth * (window - 1)
        panels.append({"title": f"{task}, L={depth}, w={window}, {seeds}",
                       "series": series, "lines": [(rf, f"SWA's field L·(w−1)={rf}")]})
    sizes = sorted({(r["seq_len"], r.get("steps", "?")) for r in records}, key=str)
    trained.profile(panels, path, "; ".join(f"n = {n}, {steps} training steps" for n, steps in sizes),
                    xlabel="key–query distance", ylabel="accuracy", ylim=(-0.03, 1.05))


