"""``cli.py evaluate``: zero-shot results for one or more checkpoints, as JSON, a markdown table in the
paper's layout with a 95% interval on every number, and TensorBoard scalars.

    python cli.py evaluate --ckpt runs/tiny/tb/version_0/checkpoints/last.ckpt --tasks offline
    python cli.py evaluate --ckpt full.ckpt swa.ckpt sa.ckpt sa_swa.ckpt --tasks table1 \
        --label Full SWA SA SA+SWA --baseline SWA   # Table 1, each row against SWA
    python cli.py evaluate --ckpt sa.ckpt --seeds 0 1 2 3 4 --eval_samples 4   # permutation variance

Every (checkpoint, σ seed) is a cell: ``cells/<label>_s<k>_<digest>.json`` and its per-item records beside it
(``.items.jsonl.gz``: each document's scores and log-likelihoods, as the sweeps keep them), so any two rows can be
compared item by item; a rerun reuses a cell whose inputs are the same. The
intervals are a percentile bootstrap over the documents, two-level (documents, then seeds within each
document) for a checkpoint scored under several σ seeds: one whose attention draws (SA, the random keys and their
gated pairs) is scored under ``--seeds``, five by default, and one that draws nothing once. ``--baseline`` adds
each other row minus that one, paired on the same documents, with a verdict worded from its interval.
"""
from __future__ import annotations

import argparse
import json
import math
import re
import statistics
import time
from pathlib import Path

import numpy as np

from .harness import Column, layout_for, run_tasks_with_items
from .table import markdown_table
from ..utils.argtypes import doc_help, non_negative_int, positive_int, seed
from ..utils.atomic import (check_own_files, check_results_folder, output_folder, read_records, replacing_files,
                            write_text)
from ..utils.runner import fingerprint, folder_lock, prune_cells, run_cells, spec_digest, unique_seeds
from ..utils.report import RESULT_FILES, compare_json, head, row
from ..utils.tables import write_csv
from ..utils.stats import (LEVEL, MIN_UNITS, RESAMPLES, Interval, comparison_row, derived_seed, paired_difference,
                           two_level_bootstrap)
from ..attention import sigma_seeds, variant_label


#: σ seeds a checkpoint that draws is scored under when ``--seeds`` is not given: five, as every stochastic result
DEFAULT_SEEDS = (0, 1, 2, 3, 4)


def seeds_of(info: dict, given: list[int] | None) -> list[int]:
    """The σ seeds one checkpoint is scored under: ``given`` (or ``DEFAULT_SEEDS``) where its attention draws,
    the first alone where it draws nothing (every seed would score it the same)."""
    return sigma_seeds(info["arch"]["attention"]["variant"], given or DEFAULT_SEEDS)


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


def item_matrix(per_seed_items: list[dict[str, list[dict]]], task: str, metric: str) -> tuple[list, np.ndarray] | None:
    """(document ids, (seeds, documents) scores) of ``metric`` on ``task`` over the seeds, on the documents every
    seed scored, in the first seed's order; None where a record lacks it (a corpus-level perplexity)."""
    runs = [items.get(task) or [] for items in per_seed_items]
    if not all(runs) or any(metric not in r.get("scores", {}) for run in runs for r in run):
        return None
    common = set.intersection(*({r["doc_id"] for r in run} for run in runs))
    ids = [r["doc_id"] for r in runs[0] if r["doc_id"] in common]
    at = [{r["doc_id"]: r["scores"][metric] for r in run} for run in runs]
    return ids, np.array([[scores[i] for i in ids] for scores in at], dtype=np.float64)


def _per_item(col: Column, scores: np.ndarray) -> np.ndarray:
    """A column's per-item values in the unit a mean is taken in: accuracies in points; for lm-eval's per-item
    ``perplexity`` (the document's log-likelihood, aggregated as exp(-mean)), the negative log-likelihood."""
    if col.metric == "perplexity":
        return -scores
    return scores * (100.0 if col.is_accuracy else 1.0)


def intervals_of(per_seed_items: list[dict[str, list[dict]]], columns: tuple[Column, ...], label: str
                 ) -> dict[str, Interval]:
    """Each column's mean and 95% interval, in the table's unit, from one row's per-item records (a perplexity
    column's interval is its mean NLL's, mapped through exp)."""
    out = {}
    for col in columns:
        found = item_matrix(per_seed_items, col.task, col.metric)
        if found is not None:
            ci = two_level_bootstrap(_per_item(col, found[1]), seed=derived_seed(0, label, col.task))
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
            if a is None or b is None:
                continue
            in_b = set(b[0])
            common = [i for i in a[0] if i in in_b]
            if not common:
                continue
            ia, ib = ({i: j for j, i in enumerate(ids)} for ids in (a[0], b[0]))
            diff = paired_difference(_per_item(col, a[1][:, [ia[i] for i in common]]),
                                     _per_item(col, b[1][:, [ib[i] for i in common]]),
                                     seed=derived_seed(0, label, baseline, col.task))
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
    lines = head(["A − B", "Column", "Δ [95% interval]", "Unit", "Verdict", "Documents", "Seeds A/B"])
    for r in rows:
        cell = Interval.from_dict(r).text("+.1f" if r["unit"] == "points" else "+.3f")
        lines.append(row([f"{r['a']} − {r['b']}", r["column"], cell, r["unit"], r["verdict"], r["items"],
                          f"{r['seeds']}/{r['seeds_b']}"]))
    return "\n".join(lines) + "\n"


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


def evaluate(args: argparse.Namespace) -> dict:
    from ..models.checkpoint import load_checkpoint
    from .harness import load_tasks, resolve_tasks

    out = check_results_folder(args.out, "evaluation", overwrite=args.overwrite)  # before any checkpoint loads
    check_own_files(out, list(RESULT_FILES), args.overwrite, "evaluation")
    loaded = [load_checkpoint(path) for path in args.ckpt]  # a bad checkpoint fails first, in a second
    tasks = resolve_tasks(args.tasks)
    load_tasks(tasks)  # every dataset is at hand before any checkpoint is scored
    labels = _unique(args.label or [label_of(info) for _, info in loaded])
    if len(labels) != len(loaded):
        raise ValueError(f"--label got {len(labels)} names for {len(loaded)} checkpoints; give one per --ckpt.")
    if len({slug(label) for label in labels}) != len(labels):
        raise ValueError(f"--label names {', '.join(labels)} share a file name once their characters other than "
                         "letters, digits and ._+=@- (spaces, slashes) are replaced by _; give labels that differ in "
                         "letters or digits.")
    if args.baseline is not None and args.baseline not in labels:
        raise ValueError(f"--baseline {args.baseline!r} is none of the rows: {', '.join(labels)}.")
    if args.baseline is not None and len(labels) == 1:
        raise ValueError(f"--baseline {args.baseline!r} is the only row, so there is nothing to compare with it; give "
                         "another --ckpt to compare, or leave --baseline out.")
    given = unique_seeds(args.seeds, "--seeds") if args.seeds else None
    seeds = {label: seeds_of(info, given) for (_, info), label in zip(loaded, labels)}
    with folder_lock(out, "evaluation"):
        return _evaluate(args, out, tasks, loaded, labels, seeds)


def _evaluate(args, out: Path, tasks: list[str], loaded: list, labels: list[str], seeds: dict) -> dict:
    from .lm import SALM

    models = {label: (model, info) for (model, info), label in zip(loaded, labels)}
    weights = {label: fingerprint(info["path"]) for label, (_, info) in models.items()}
    todo = [(label, s) for label in labels for s in seeds[label]]
    print(f"evaluate: {len(labels)} checkpoint(s), tasks {', '.join(tasks)}, "
          f"{_limit_words(args.limit, 'every')} document(s) of each, σ seeds "
          f"{_seed_counts(seeds)} (a model that draws nothing is scored once): {len(todo)} cell(s), results in "
          f"{out}/", flush=True)

    def spec_of(cell) -> dict:
        label, sigma_seed = cell
        return {"checkpoint": weights[label], "tasks": tasks, "limit": args.limit, "eval_samples": args.eval_samples,
                "sa_mode": args.sa_mode, "seed": sigma_seed, "tokenizer": args.tokenizer,
                "bootstrap_iters": args.bootstrap_iters}

    def run(cell, spec) -> dict:
        label, sigma_seed = cell
        model, info = models[label]
        start = time.perf_counter()
        lm = SALM(model, tokenizer=args.tokenizer or info["tokenizer"], batch_size=args.batch_size,
                  device=args.device, eval_samples=args.eval_samples, sa_mode=args.sa_mode, seed=sigma_seed)
        metrics, records = run_tasks_with_items(lm, tasks, limit=args.limit, bootstrap_iters=args.bootstrap_iters,
                                                seed=sigma_seed)
        return {"label": label, "seed": sigma_seed, "metrics": metrics, "seconds": time.perf_counter() - start,
                "items": [{"task": task, **r} for task, task_records in records.items() for r in task_records]}

    done = run_cells(todo, out, lambda c: cell_id(*c, spec_of(c)), spec_of, run, line=lambda r: "scored",
                     needs="metrics", kind="evaluation")
    by_cell = dict(zip(todo, done))  # in grid order (a reused cell may carry another label of the same file name)
    report = {"experiment": "evaluate", "tasks": tasks, "limit": args.limit, "eval_samples": args.eval_samples, "sa_mode": args.sa_mode,
              "seeds": seeds, "models": {}}
    means, stds, items = {}, {}, {}
    for label in labels:
        _, info = models[label]
        cells_ = [by_cell[(label, s)] for s in seeds[label]]
        per_seed = [c["metrics"] for c in cells_]
        items[label] = [_by_task(read_records(out / "cells" / c["items"]["file"])) for c in cells_]
        means[label], stds[label] = summarize(per_seed)
        report["models"][label] = {"checkpoint": info["path"], "weights": weights[label], "step": info["step"],
                                   "arch": info["arch"], "per_seed": per_seed, "mean": means[label],
                                   "std": stds[label], "items": [f"cells/{c['items']['file']}" for c in cells_]}
        log_tensorboard(out / "tb" / slug(label), means[label], step=info["step"] or 0)
    columns = layout_for(next(iter(means.values())))
    intervals = {label: intervals_of(items[label], columns, label) for label in labels}
    for label in labels:
        report["models"][label]["intervals"] = {k: ci.as_dict() for k, ci in intervals[label].items()}
    most = max(len(s) for s in seeds.values())
    method = (f"{LEVEL:.0%} intervals: a percentile bootstrap ({RESAMPLES} resamples) over the documents, widened by "
              f"the small-sample factor"
              + (f", each document counted as its mean over a row's σ seeds ({_seed_counts(seeds)}; σ is drawn per "
                 "input)" if most > 1 else "")
              + f"; with fewer than {MIN_UNITS} documents, the range of their values instead"
              + "; a perplexity column's is exp of its mean NLL's over documents and seeds (the table above "
              "averages each seed's perplexity); \"–\": not a mean over documents (a rolling perplexity). "
              "Per-item records: "
              f"{out / 'cells'}.")
    scored = items[labels[0]][0]  # the documents each task scored (the same for every row and seed)
    documents = ", ".join(f"{task} {len(scored.get(task, []))}" for task in tasks)
    text = f"Zero-shot, tasks: {', '.join(tasks)}; documents scored: {documents} " \
           f"({_limit_words(args.limit)} of each); " \
           f"eval_samples={args.eval_samples}; " \
           f"sa_mode={args.sa_mode}; σ seeds: {_seed_counts(seeds)}\n\n{markdown_table(means, columns)}\n" \
           f"With intervals ({method})\n\n{interval_markdown(intervals, columns)}"
    if most > 1:
        spread = {label: std for label, std in stds.items() if len(seeds[label]) > 1}
        text += "\nStandard deviation over each row's σ seeds (the rows that draw):\n\n" + \
            markdown_table(spread, columns).replace("**", "").replace("<u>", "").replace("</u>", "")
    compared = "No comparison: `--baseline LABEL` compares every other row with that one.\n"
    if args.baseline is not None:
        report["comparisons"] = comparisons_of(items, columns, args.baseline)
        compared = (f"Each row minus {args.baseline}, paired on the same documents (a paired bootstrap that draws "
                    f"them once for both sides), with a verdict worded from the interval:\n\n"
                    f"{comparison_markdown(report['comparisons'])}")
        text += "\n" + compared
    flat = [{"model": label, "column": column, **ci} for label, model in report["models"].items()
            for column, ci in model["intervals"].items()]
    with replacing_files(out, "evaluation", overwrite=args.overwrite) as tmp:  # the whole set, or the previous one
        write_text(tmp / "results.json", json.dumps(report, indent=2))
        write_text(tmp / "table.md", text)
        write_text(tmp / "compare.md", compared)
        write_text(tmp / "compare.json", json.dumps(compare_json("evaluate", report.get("comparisons", [])),
                                                    indent=2))
        write_csv(tmp / "results.csv", flat, fields=list(dict.fromkeys(k for r in flat for k in r)))
    prune_cells(out, [cell_id(*c, spec_of(c)) for c in todo], "evaluation")
    print(text)
    print(f"wrote {out}/table.md, compare.md, compare.json, results.json, results.csv, per-item records in "
          f"{out / 'cells'} and TensorBoard "
          f"logs in {out / 'tb'}")
    return report


def task_limit(text: str) -> int | float:
    """An argparse type for ``--limit``: a whole number of documents (>= 1), or a fraction of each task in (0, 1)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number of documents or a fraction below 1, got {text!r}") from None
    if not value > 0 or (value >= 1 and not value.is_integer()):
        raise argparse.ArgumentTypeError(f"must be a whole number of documents (>= 1) or a fraction of each task "
                                         f"in (0, 1), got {text}")
    return int(value) if value >= 1 else value


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="cli.py evaluate", **doc_help(__doc__))
    p.add_argument("--ckpt", nargs="+", required=True, help="checkpoints written by `cli.py fit`")
    p.add_argument("--label", nargs="+", help="row names, one per checkpoint (default: variant and window)")
    p.add_argument("--tasks", nargs="+", default=["offline"],
                   help="task names, or the sets `table1` (the paper's) and `offline` (shipped; the default)")
    p.add_argument("--limit", type=task_limit, default=None, help="documents per task (an int, or a fraction < 1)")
    p.add_argument("--batch_size", type=positive_int, default=32, help="documents scored per forward pass")
    p.add_argument("--eval_samples", type=positive_int, default=1, help="permutation draws averaged per score (SA)")
    p.add_argument("--sa_mode", choices=("stochastic", "deterministic"), default="stochastic",
                   help="stochastic: each document draws its own σ (the paper's); deterministic: one σ per layer "
                        "and length for every document")
    p.add_argument("--seeds", type=seed, nargs="+", default=None,
                   help=f"σ seeds of a checkpoint whose attention draws (SA, the random keys, their gated pairs; "
                        f"default {' '.join(map(str, DEFAULT_SEEDS))}); >1 also reports the std. A checkpoint that "
                        f"draws nothing is scored once, under the first")
    p.add_argument("--tokenizer", default=None, help="override the checkpoint's tokenizer")
    p.add_argument("--device", default=None, help="where to score (cuda, cuda:1, cpu); default: the CPU, where a checkpoint loads")
    p.add_argument("--bootstrap_iters", type=non_negative_int, default=0,
                   help="lm-eval's stderr bootstrap (0: off, fast); the table's intervals are computed either way")
    p.add_argument("--baseline", default=None,
                   help="a row label: add each other row minus it, paired on the same documents, with a verdict")
    p.add_argument("--out", type=output_folder, default="outputs/eval",
                   help="the evaluation's folder: table.md, compare.md, compare.json, results.json, results.csv, "
                        "cells/, tb/")
    p.add_argument("--overwrite", action="store_true",
                   help="write into an --out that holds other files: files with the evaluation's names (cells/, tb/, "
                        "table.md, compare.md, compare.json, results.json, results.csv) are replaced, yours of those names too; nothing else there is "
                        "touched or removed")
    return p


def main(argv: list[str] | None = None) -> dict:
    args = parser().parse_args(argv)
    if args.device is not None:
        from ..utils.device import check_device

        check_device(args.device)
    return evaluate(args)
