"""``cli.py evaluate``: zero-shot results for one or more checkpoints, as JSON, a markdown table in the
paper's layout with a 95% interval on every number, and TensorBoard scalars.

    python cli.py evaluate --ckpt runs/tiny/tb/version_0/checkpoints/last.ckpt --tasks offline
    python cli.py evaluate --ckpt full.ckpt swa.ckpt sa.ckpt sa_swa.ckpt --tasks table1 \\
        --label Full SWA SA SA+SWA --baseline SWA   # Table 1, each row against SWA
    python cli.py evaluate --ckpt sa.ckpt --seeds 0 1 2 3 4 --eval_samples 4   # permutation variance
    python cli.py evaluate --ckpt sa.ckpt --preset quick   # presets: configs/evaluate.yaml

Every (checkpoint, σ seed) is a cell: ``cells/<label>_s<k>_<digest>.json`` and its per-item records beside it
(``.items.jsonl.gz``: each document's scores and log-likelihoods, as the sweeps keep them), so any two rows can be
compared item by item; a rerun reuses a cell whose inputs are the same. The
intervals are a percentile bootstrap over the documents, two-level (documents, then seeds within each
document) for a checkpoint scored under several σ seeds: one whose attention draws (SA, the random keys and their
gated pairs) is scored under ``--seeds``, five by default, and one that draws nothing once. ``--baseline`` adds
each other row minus that one, paired on the same documents, with a verdict worded from its interval.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from ..eval.evaluate import (DEFAULT_SEEDS, _by_task, _limit_words, _seed_counts, _unique, comparison_markdown,
                             comparisons_of, interval_markdown, intervals_of, label_of, log_tensorboard, seeds_of,
                             slug, summarize)
from ..eval.evaluate import cell_id as cell_name
from ..utils.argtypes import non_negative_int, positive_int, seed, task_limit
from ..utils.runner import fingerprint, unique_seeds
from ..utils.stats import LEVEL, MIN_UNITS, RESAMPLES
from .base import Experiment, Flag, Report
from .base import main as run_experiment


@dataclass
class EvaluateConfig:
    """The settings (``--help`` says each; ``configs/evaluate.yaml`` holds the defaults and the presets)."""

    ckpt: list[str]
    label: list[str] | None = None
    tasks: list[str] | None = None
    limit: int | float | None = None
    batch_size: int = 32
    eval_samples: int = 1
    sa_mode: str = "stochastic"
    seeds: list[int] | None = None
    tokenizer: str | None = None
    device: str | None = None
    bootstrap_iters: int = 0
    baseline: str | None = None
    out: str = "outputs/eval"

    def __post_init__(self):
        if self.device is not None:
            from ..utils.device import check_device

            check_device(self.device)


@dataclass(frozen=True)
class EvalCell:
    """One checkpoint (its row label) under one σ seed, with its spec: everything that made it."""

    label: str
    seed: int
    spec: dict = field(compare=False, hash=False)

    @property
    def key(self) -> str:
        return cell_name(self.label, self.seed, self.spec)


FLAGS = (
    Flag("ckpt", "checkpoints written by `cli.py fit`"),
    Flag("label", "row names, one per checkpoint (default: variant and window)"),
    Flag("tasks", "task names, or the sets `table1` (the paper's) and `offline` (shipped)"),
    Flag("limit", "documents per task (an int, or a fraction < 1); null: every document", task_limit, None),
    Flag("batch_size", "documents scored per forward pass", positive_int, None),
    Flag("eval_samples", "permutation draws averaged per score (SA)", positive_int, None),
    Flag("sa_mode", "stochastic: each document draws its own σ (the paper's); deterministic: one σ per layer and "
                    "length for every document. A checkpoint trained with a fixed σ (permutation: deterministic, "
                    "sa_fixed) keeps the one it trained with, and is scored once", str, None,
         ("stochastic", "deterministic")),
    Flag("seeds", f"σ seeds of a checkpoint whose attention draws (SA, the random keys, their gated pairs; null: "
                  f"{' '.join(map(str, DEFAULT_SEEDS))}); >1 also reports the std. A checkpoint that draws nothing is "
                  "scored once, under the first", seed),
    Flag("tokenizer", "override the checkpoint's tokenizer (null: the checkpoint's)", str, None),
    Flag("device", "where to score (cuda, cuda:1, cpu); null: the CPU, where a checkpoint loads", str, None),
    Flag("bootstrap_iters", "lm-eval's stderr bootstrap (0: off, fast); the table's intervals are computed either "
                            "way", non_negative_int, None),
    Flag("baseline", "a row label: add each other row minus it, paired on the same documents, with a verdict "
                     "(null: no comparison)", str, None),
)


class Evaluate(Experiment):
    name = "evaluate"
    kind = "evaluation"
    config = EvaluateConfig
    config_file = "configs/evaluate.yaml"
    presets_note = "quick: 40 documents, two σ seeds; table1: the paper's tasks; permutation: eight σ seeds"
    folders = "outputs/eval, outputs/eval_<preset>"
    flags = FLAGS
    needs = "metrics"
    prunes = True
    writes = ("tb",)  # TensorBoard's scalars, one folder per row, written with the rest of the set

    def prepare(self, cfg):
        """The checkpoints (a bad one fails first, in a second) and their fingerprints, the tasks, the labels and the
        σ seeds, once the output folder was checked (``main``) and this run's own files in it; one line says them.
        This is before the folder's lock: a folder in use is refused after the checkpoints load and hash (each was
        read whole to load; a file above 256 MiB is hashed by samples)."""
        from ..eval.harness import load_tasks, resolve_tasks
        from ..models.checkpoint import load_checkpoint

        loaded = [load_checkpoint(path) for path in cfg.ckpt]
        cfg.tasks = resolve_tasks(cfg.tasks or ["offline"])
        load_tasks(cfg.tasks)  # every dataset is at hand before any checkpoint is scored
        labels = _unique(cfg.label or [label_of(info) for _, info in loaded])
        if len(labels) != len(loaded):
            raise ValueError(f"--label got {len(labels)} names for {len(loaded)} checkpoints; give one per --ckpt.")
        if len({slug(label) for label in labels}) != len(labels):
            raise ValueError(f"--label names {', '.join(labels)} share a file name once their characters other than "
                             "letters, digits and ._+=@- (spaces, slashes) are replaced by _; give labels that differ "
                             "in letters or digits.")
        if cfg.baseline is not None and cfg.baseline not in labels:
            raise ValueError(f"--baseline {cfg.baseline!r} is none of the rows: {', '.join(labels)}.")
        if cfg.baseline is not None and len(labels) == 1:
            raise ValueError(f"--baseline {cfg.baseline!r} is the only row, so there is nothing to compare with it; "
                             "give another --ckpt to compare, or leave --baseline out.")
        given = unique_seeds(cfg.seeds, "--seeds") if cfg.seeds else None
        self.models = {label: (model, info) for (model, info), label in zip(loaded, labels)}
        self.seeds = {label: seeds_of(info, given) for label, (_, info) in self.models.items()}
        self.weights = {label: fingerprint(info["path"]) for label, (_, info) in self.models.items()}
        print(f"evaluate: {len(labels)} checkpoint(s), tasks {', '.join(cfg.tasks)}, "
              f"{_limit_words(cfg.limit, 'every')} document(s) of each, σ seeds {_seed_counts(self.seeds)} (a model "
              "that draws nothing is scored once)", flush=True)

    def cells(self, cfg):
        return [EvalCell(label, s, {"checkpoint": self.weights[label], "tasks": cfg.tasks, "limit": cfg.limit,
                                    "eval_samples": cfg.eval_samples, "sa_mode": cfg.sa_mode, "seed": s,
                                    "tokenizer": cfg.tokenizer, "bootstrap_iters": cfg.bootstrap_iters})
                for label in self.models for s in self.seeds[label]]

    def spec(self, cell, cfg, out):
        return cell.spec

    def run(self, cell, spec):
        from ..eval.harness import run_tasks_with_items
        from ..eval.lm import SALM

        label, sigma_seed = cell.label, cell.seed
        model, info = self.models[label]
        cfg, start = self.cfg, time.perf_counter()
        lm = SALM(model, tokenizer=cfg.tokenizer or info["tokenizer"], batch_size=cfg.batch_size, device=cfg.device,
                  eval_samples=cfg.eval_samples, sa_mode=cfg.sa_mode, seed=sigma_seed)
        metrics, records = run_tasks_with_items(lm, cfg.tasks, limit=cfg.limit, bootstrap_iters=cfg.bootstrap_iters,
                                                seed=sigma_seed)
        return {"label": label, "seed": sigma_seed, "metrics": metrics, "seconds": time.perf_counter() - start,
                "items": [{"task": task, **r} for task, task_records in records.items() for r in task_records]}

    def line(self, record):
        """A scored cell's line: each column of the table it feeds (``Shk. ppl 41.2, LW 12.5``), accuracies in %."""
        from ..eval.harness import layout_for

        metrics = record["metrics"]
        return ", ".join(f"{c.label} {metrics[c.task][c.metric] * (100 if c.is_accuracy else 1):.1f}"
                         for c in layout_for(metrics) if c.metric in metrics[c.task])

    def report(self, cfg, records, out):
        from ..eval.harness import layout_for
        from ..eval.table import markdown_table

        labels, seeds = list(self.seeds), self.seeds
        grid = [(label, s) for label in labels for s in seeds[label]]
        if len(records) != len(grid):  # --compare before every cell was scored
            raise ValueError(f"an evaluation's table needs every (checkpoint, σ seed) cell, and {len(records)} of "
                             f"{len(grid)} are done in {out / 'cells'}; run it without --compare to score the rest.")
        by_cell = dict(zip(grid, records))  # in grid order (a reused cell may carry another label)
        report = {"seeds": seeds, "models": {}}
        means, stds, items = {}, {}, {}
        for label in labels:
            _, info = self.models[label]
            cells_ = [by_cell[(label, s)] for s in seeds[label]]
            per_seed = [c["metrics"] for c in cells_]
            items[label] = [_by_task(c["items"]) for c in cells_]
            means[label], stds[label] = summarize(per_seed)
            report["models"][label] = {"checkpoint": info["path"], "weights": self.weights[label],
                                       "step": info["step"], "arch": info["arch"], "per_seed": per_seed,
                                       "mean": means[label], "std": stds[label],
                                       "items": [f"cells/{c['items_file']}" for c in cells_]}
        columns = layout_for(next(iter(means.values())))
        intervals = {label: intervals_of(items[label], columns, label) for label in labels}
        for label in labels:
            report["models"][label]["intervals"] = {k: ci.as_dict() for k, ci in intervals[label].items()}
        most = max(len(s) for s in seeds.values())
        method = (f"{LEVEL:.0%} intervals: a percentile bootstrap ({RESAMPLES} resamples) over the documents, widened "
                  f"by the small-sample factor"
                  + (f", each document counted as its mean over a row's σ seeds ({_seed_counts(seeds)}; σ is drawn "
                     "per input)" if most > 1 else "")
                  + f"; with fewer than {MIN_UNITS} documents, the range of their values instead"
                  + "; a perplexity column's is exp of its mean NLL's over documents and seeds (the table above "
                  "averages each seed's perplexity); \"–\": not a mean over documents (a rolling perplexity). "
                  f"Per-item records: {out / 'cells'}.")
        scored = items[labels[0]][0]  # the documents each task scored (the same for every row and seed)
        documents = ", ".join(f"{task} {len(scored.get(task, []))}" for task in cfg.tasks)
        text = (f"Zero-shot, tasks: {', '.join(cfg.tasks)}; documents scored: {documents} "
                f"({_limit_words(cfg.limit)} of each); eval_samples={cfg.eval_samples}; sa_mode={cfg.sa_mode}; "
                f"σ seeds: {_seed_counts(seeds)}\n\n{markdown_table(means, columns)}\n"
                f"With intervals ({method})\n\n{interval_markdown(intervals, columns)}")
        if most > 1:
            spread = {label: std for label, std in stds.items() if len(seeds[label]) > 1}
            text += "\nStandard deviation over each row's σ seeds (the rows that draw):\n\n" + \
                markdown_table(spread, columns).replace("**", "").replace("<u>", "").replace("</u>", "")
        compared, rows = "No comparison: `--baseline LABEL` compares every other row with that one.\n", []
        if cfg.baseline is not None:
            rows = comparisons_of(items, columns, cfg.baseline)
            compared = (f"Each row minus {cfg.baseline}, paired on the same documents (a paired bootstrap that "
                        f"draws them once for both sides), with a verdict worded from the interval:\n\n"
                        f"{comparison_markdown(rows)}")
            text += "\n" + compared
        flat = [{"model": label, "column": column, **ci} for label, model in report["models"].items()
                for column, ci in model["intervals"].items()]
        steps = {label: info["step"] or 0 for label, (_, info) in self.models.items()}
        tensorboard = {"tb": lambda path: [log_tensorboard(path / slug(label), means[label], steps[label])
                                           for label in labels]}  # written with the set, the earlier tb/ replaced
        return Report(table=text, compare=compared, comparisons=rows, rows=flat, results_extra=report,
                      figures=tensorboard,
                      summary=f"per-item records in {out / 'cells'}, TensorBoard logs in {out / 'tb'}")


EXPERIMENT = Evaluate()


def main(argv: list[str] | None = None) -> dict:
    return run_experiment(EXPERIMENT, argv)
