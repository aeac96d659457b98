"""What ``cli.py evaluate`` (``experiments.evaluate``) computes from its cells: each checkpoint's row label and σ
seeds, the per-item matrices, each column's mean with its 95% interval (a percentile bootstrap over the documents,
two-level for several σ seeds), the paired comparisons against a baseline, their tables, and TensorBoard scalars.
"""
from __future__ import annotations

import math
import re
import statistics
from dataclasses import replace
from pathlib import Path

from ..attention import sigma_seeds, variant_label
from ..utils.items import Items, align, interval, paired
from ..utils.report import Column as Cell, ab_table, head, row
from ..utils.runner import spec_digest
from ..utils.stats import Interval, comparison_row, derived_seed
from .harness import Column


#: σ seeds a checkpoint that draws is scored under when ``--seeds`` is not given: five, as every stochastic result
DEFAULT_SEEDS = (0, 1, 2, 3, 4)


def seeds_of(info: dict, given: list[int] | None) -> list[int]:
    """The σ seeds one checkpoint is scored under: ``given`` (or ``DEFAULT_SEEDS``) where its attention draws,
    the first alone where it draws nothing or keeps the one σ it trained with (``permutation: deterministic``, a
    frozen variant): every seed would score it the same."""
    seeds = sigma_seeds(info["arch"]["attention"]["variant"], given or DEFAULT_SEEDS)
    return seeds[:1] if info["arch"].get("permutation") == "deterministic" else seeds


def label_of(info: dict) -> str:
    """A checkpoint's row name from its ``arch``: ``SA+SWA (w=32)``, ``MoBA (c=64, k=2)``, ``Full``."""
    attention = info["arch"]["attention"]
    return variant_label(attention["variant"], attention.get("window"), attention.get("block_size"),
                         attention.get("top_k"), attention.get("sink", 0))


def _unique(labels: list[str]) -> list[str]:
    seen: dict[str, int] = {}
    out = []
    for label in labels:
        seen[label] = seen.get(label, 0) + 1
        out.append(label if labels.count(label) == 1 else f"{label} #{seen[label]}")
    return out


def _seed_counts(seeds: dict[str, list[int]]) -> str:
    """``SA: 0 1 2 3 4; Full: 0`` (the σ seeds each row was scored under)."""
    return "; ".join(f"{label}: {' '.join(map(str, s))}" for label, s in seeds.items())


def summarize(per_seed: list[dict[str, dict[str, float]]]) -> tuple[dict, dict]:
    """Mean and (sample) standard deviation over seeds of every metric."""
    mean, std = {}, {}
    for task in per_seed[0]:
        mean[task], std[task] = {}, {}
        for metric in per_seed[0][task]:
            values = [run[task][metric] for run in per_seed if metric in run.get(task, {})]
            mean[task][metric] = statistics.fmean(values)
            std[task][metric] = statistics.stdev(values) if len(values) > 1 else 0.0
    return mean, std


def slug(label: str) -> str:
    """A row label as a file name: letters and digits of any script and ``._+=@-`` kept, any other run of characters
    (spaces, slashes) one ``_``."""
    return re.sub(r"[^\w.+=@-]+", "_", label).strip("_") or "model"


def _limit_words(limit, whole: str = "every one") -> str:
    """``--limit`` in words: ``whole`` without one, the first N documents, or the first share of them."""
    if not limit:
        return whole
    return f"the first {limit}" if isinstance(limit, int) else f"the first {limit:.0%}"


def _by_task(records: list[dict]) -> dict[str, list[dict]]:
    """A cell's per-item records (each with its ``task``) by task, as ``run_tasks_with_items`` returns them."""
    out: dict[str, list[dict]] = {}
    for r in records:
        out.setdefault(r["task"], []).append({k: v for k, v in r.items() if k != "task"})
    return out


def item_matrix(per_seed_items: list[dict[str, list[dict]]], task: str, metric: str) -> Items | None:
    """``metric`` on ``task`` over the σ seeds (``utils.items.align``: the documents every seed scored, in the first
    seed's order); None where a record lacks it (a corpus-level perplexity)."""
    runs = [items.get(task) or [] for items in per_seed_items]
    if not all(runs) or any(metric not in r.get("scores", {}) for run in runs for r in run):
        return None
    return align([(k, [r["doc_id"] for r in run], [r["scores"][metric] for r in run], None)
                  for k, run in enumerate(runs)])


def _per_item(col: Column, found: Items) -> Items:
    """A column's per-item values in the unit a mean is taken in: accuracies in points; for lm-eval's per-item
    ``perplexity`` (the document's log-likelihood, aggregated as exp(-mean)), the negative log-likelihood."""
    scale = -1.0 if col.metric == "perplexity" else (100.0 if col.is_accuracy else 1.0)
    return replace(found, matrix=found.matrix * scale)


def intervals_of(per_seed_items: list[dict[str, list[dict]]], columns: tuple[Column, ...], label: str
                 ) -> dict[str, Interval]:
    """Each column's mean and 95% interval, in the table's unit, from one row's per-item records (a perplexity
    column's interval is its mean NLL's, mapped through exp)."""
    out = {}
    for col in columns:
        found = item_matrix(per_seed_items, col.task, col.metric)
        if found is not None:
            ci = interval(_per_item(col, found), seed=derived_seed(0, label, col.task))
            out[col.label] = ci.map(math.exp) if col.metric == "perplexity" else ci
    return out


def comparisons_of(items: dict[str, list[dict]], columns: tuple[Column, ...], baseline: str) -> list[dict]:
    """Each other row minus ``baseline``, per column, paired on the documents both scored."""
    rows = []
    for label in items:
        if label == baseline:
            continue
        for col in columns:
            a, b = item_matrix(items[label], col.task, col.metric), item_matrix(items[baseline], col.task, col.metric)
            diff = None if a is None or b is None else \
                paired(_per_item(col, a), _per_item(col, b), seed=derived_seed(0, label, baseline, col.task))
            if diff is None:
                continue
            nll = col.metric == "perplexity"
            column = f"{col.label}: NLL" if nll else col.label
            rows.append(comparison_row(diff, col.lower_is_better, setting=[column], a=label, b=baseline,
                                       outcome=column, column=column,
                                       unit="nats" if nll else ("points" if col.is_accuracy else "value")))
    return rows


def interval_markdown(intervals: dict[str, dict[str, Interval]], columns: tuple[Column, ...]) -> str:
    """The table's numbers as ``mean [lo, hi]``; ``–`` where the metric is not a mean over documents."""
    lines = head(["Model", *(c.label for c in columns)])
    for label, cells in intervals.items():
        lines.append(row([label, *(cells[c.label].text(".2f" if not c.is_accuracy else ".1f") if c.label in cells
                                   else "–" for c in columns)]))
    return "\n".join(lines) + "\n"


def comparison_markdown(rows: list[dict]) -> str:
    """The paired rows as a table; a difference in nats gets three decimals, one in points one."""
    return "\n".join(ab_table(rows, [
        Cell("A − B", lambda r: f"{r['a']} − {r['b']}"), Cell("Column", lambda r: r["column"]),
        Cell("Δ [95% interval]", lambda r: Interval.from_dict(r).text("+.1f" if r["unit"] == "points" else "+.3f")),
        Cell("Unit", lambda r: r["unit"]), Cell("Verdict", lambda r: r["verdict"]),
        Cell("Documents", lambda r: r["items"]), Cell("Seeds A/B", lambda r: f"{r['seeds']}/{r['seeds_b']}")])) \
        + "\n"


def log_tensorboard(folder: Path, metrics: dict[str, dict[str, float]], step: int = 0) -> None:
    from torch.utils.tensorboard import SummaryWriter

    from .harness import scalars

    with SummaryWriter(str(folder)) as writer:
        for tag, value in scalars(metrics).items():
            writer.add_scalar(tag, value, step)


def cell_id(label: str, sigma_seed: int, spec: dict) -> str:
    """A (checkpoint, σ seed) cell's file name in ``<out>/cells/``, with a digest of everything that made it: a
    run with other settings writes cells of its own, so the previous run's set stays whole until the new set is
    in place (a kill at any instant leaves one set or the other)."""
    return f"{slug(label)}_s{sigma_seed}_{spec_digest(spec)}"
