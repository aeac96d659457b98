"""``cli.py study pretrain``: Table 1 at micro scale, every variant beside its controls, over training seeds.

    python cli.py study pretrain [--config configs/study/pretrain.yaml] [--preset quick] [--seeds 0 1 2]
                                 [--models full sa@32 ...] [--limit N] [--set KEY=VALUE] [--out DIR]

Each cell, one (model, training seed), trains the embedded default (``configs/tiny.yaml``) with ``cli.py fit``, its
variant, window and seed swapped in. A model is ``<variant>@<w>`` (``swa@64``: SWA at twice the window, the gated
pair's equal-compute reference) or ``full``. The trained model is scored item by item, every item kept: the NLL of
each validation block (and, where the data plants repeats, of the planted copies) and the shipped offline tasks
through lm-eval's per-document records. A model that draws is scored once per evaluation σ seed, an item counting
as its mean over them. The report is Table 1's layout over training seeds (``table.md``, ``table1.png``) and the
comparisons paired by seed (``compare.md``), all through ``experiments.training``'s shared report.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np

from ..attention import get_variant, variant_label
from ..attention.variants import FULL, SWA
from ..utils import trained
from ..utils.stats import MIN_UNITS
from .base import Flag, Report
from .base import main as run_experiment
from .training import VARIANT_KEY, WINDOW_KEY, TrainedConfig, TrainedExperiment, over_eval_seeds

GRID_KEYS = ("models", "seeds")
#: what each cell is scored on, in the table's order: the validation blocks' NLL (shown as a perplexity, its
#: differences in nats), the offline tasks (points), and, where the data plants repeats (``data.repeats``; the
#: ``repeats`` preset), the NLL on the planted copies that only a look back over the gap predicts
OUTCOMES = (trained.Outcome("val_ppl", "Val. PPL ↓", True, spec=".2f", unit="nats", transform=math.exp,
                            diff_name="Val. NLL/token ↓", diff_spec=".3f"),
            trained.Outcome("shakespeare_lastword", "LW acc", spec=".1f", unit="points"),
            trained.Outcome("shakespeare_choice", "MC acc_norm", spec=".1f", unit="points"),
            trained.Outcome("repeat_nll", "NLL on the repeats ↓", True, spec=".3f", unit="nats"),
            trained.Outcome("repeat_acc", "Acc. on the repeats", scale=100, spec=".1f", unit="points"))


#: a model copies where its NLL on the planted copies is at most this (a guess from the segments' alphabet costs
#: ln(alphabet) nats: 5.5 for 256 ids): the seeds that learned to copy, beside the mean over seeds
COPIED = 1.0


#: the per-item metric of each lm-eval task
TASK_METRICS = {"shakespeare_lastword": "acc", "shakespeare_choice": "acc_norm"}


# ---- settings --------------------------------------------------------------------------------------
@dataclass
class PretrainConfig(TrainedConfig):
    """``configs/study/pretrain.yaml`` (the shared fields: ``experiments.training.TrainedConfig``).

    Args:
        models: ``<variant>@<window>`` or a variant without a window (``full``); the arms of the comparisons.
        seeds: training seeds; every model trains once per seed, paired by seed in the comparisons.
        fit_config: the ``cli.py fit`` config every cell trains (its model, seed and window swapped in).
        limit: documents of each offline task. out: the output folder.
    """

    models: list[str]
    seeds: list[int]
    fit_config: str = "configs/tiny.yaml"
    limit: int | None = None
    out: str = "outputs/study/pretrain"


def parse_model(name: str) -> tuple[str, int | None]:
    """``sa@32`` -> ("sa", 32); ``full`` -> ("full", None). The variant is checked against the registry."""
    variant, sep, window = str(name).partition("@")
    get_variant(variant)
    if sep and (not window.isdigit() or int(window) < 1):
        raise ValueError(f"a model is <variant>@<window>, the window an integer >= 1, got {name!r}.")
    if sep:
        from ..attention import AttentionSpec

        AttentionSpec(variant, int(window))  # a window below a control's least (3), before any cell trains
    return variant, int(window) if sep else None


# ---- one cell --------------------------------------------------------------------------------------
def score_cell(cell: dict, spec: dict, cli, trained: float, steps: int) -> dict:
    """A trained cell's record, scored item by item (``cli``: its model and data, trained for ``steps`` steps in
    ``trained`` seconds, by its own fit or as a member of an ensemble of seeds, ``experiments.ensemble``)."""
    from ..eval.harness import run_tasks_with_items
    from ..eval.lm import SALM
    from ..lit.items import validation_items

    scoring = time.perf_counter()
    model, dm = cli.model, cli.datamodule
    by_seed = []
    for eval_seed in spec["eval_seeds"]:
        scores = {column: [round(x, 5) for x in values]
                  for column, values in validation_items(model, dm, eval_seed).items()}
        lm = SALM(model.net, tokenizer=dm.tokenizer, eval_samples=1, seed=eval_seed)
        # lm-eval's own seed stays the first: the same documents, in the same order, under every σ seed
        _, items = run_tasks_with_items(lm, list(TASK_METRICS), limit=spec["limit"], seed=spec["eval_seeds"][0])
        for task, metric in TASK_METRICS.items():
            scores[task] = [100.0 * item["scores"][metric] for item in sorted(items[task], key=lambda r: r["doc_id"])]
        by_seed.append(scores)
    return {**cell, "steps": steps, "train_seconds": round(trained, 1),
            "seconds": round(trained + time.perf_counter() - scoring, 1), "eval_seeds": list(spec["eval_seeds"]),
            **over_eval_seeds(by_seed)}


# ---- the report: through utils.trained -------------------------------------------------------------
def label(model: str) -> str:
    variant, window = parse_model(model)
    return variant_label(variant) + (f" (w={window})" if window else "")


def table(parts: list[trained.Section], cfg: PretrainConfig, results: list[dict]) -> str:
    """``table.md``: Table 1's layout (a model a row, an outcome a column, mean [95% over training seeds]), then the
    spread of each score over training seeds and over evaluation σ seeds."""
    models = list(dict.fromkeys(r["arm"] for part in parts for r in part.summaries))
    eval_seeds_of = EXPERIMENT.eval_seed_counts(results)
    lines = trained.wide_table(parts, models, label=label, extra={"σ seeds": lambda m: eval_seeds_of.get(m, 1)})
    seeds = cfg.eval_seeds or [0]
    note = (f"Each score is mean [95% interval] over the training seeds {cfg.seeds}: a t interval over each "
            f"seed's mean over the items (validation blocks, task documents), since a training seed moves every item "
            f"of its model at once; with fewer than {MIN_UNITS} seeds there is no 95% interval, and the cell shows "
            f"the range of the seeds' scores instead. A model that draws σ (or random keys) is scored under the "
            f"evaluation σ seeds {seeds}, and each item's score is its mean over them, so σ's noise is inside the "
            "interval. Val. PPL: the interval of the mean NLL per block, as a perplexity (with repeats planted: the "
            "text's own targets, neither the planted segments nor their copies). LW: last-word accuracy (%); MC: "
            "four-way choice acc_norm (%), chance 25%. NLL on the repeats: nats per token on the planted copies that "
            "only a look back over the gap predicts (`data.repeats`).")
    return "\n".join(lines + ["", note, "", *EXPERIMENT.spread_lines(parts, results, models)]) + "\n"


# ---- the experiment -------------------------------------------------------------------------------
def line(result: dict) -> str:
    s = result["scores"]
    return (f"val ppl {math.exp(np.mean(s['val_ppl'])):.2f}, " +
            (f"NLL on the repeats {np.mean(s['repeat_nll']):.3f}, " if "repeat_nll" in s else "") +
            ", ".join(f"{task} {np.mean(s[task]):.1f}%" for task in TASK_METRICS))


class Pretrain(TrainedExperiment):
    name = "study pretrain"
    config = PretrainConfig
    config_file = "configs/study/pretrain.yaml"
    presets_note = "quick: <= 5 min on 2 CPU cores"
    folders = "outputs/study/pretrain, pretrain_quick"
    flags = (Flag("models", "override the config's models (<variant>@<window> or full)"),
             Flag("seeds", "override the config's training seeds", int),
             Flag("limit", "override the config's documents per offline task", int, None))
    required = GRID_KEYS
    grid, arm = (("model", "models"),), "model"
    outcomes = OUTCOMES
    thresholds = {"repeat_nll": (COPIED, f"seeds that copy (≤ {COPIED:g} nat)")}
    line = staticmethod(line)
    score_cell = staticmethod(score_cell)
    label = staticmethod(label)

    def variant(self, arm):
        return parse_model(arm)[0]

    def cell_id(self, cell):
        return f"{cell['model'].replace('@', '_w')}_s{cell['seed']}"

    def fit_swaps(self, cell, cfg):
        variant, window = parse_model(cell["model"])
        swaps = {VARIANT_KEY: variant, "seed_everything": cell["seed"]}
        if window is not None:
            swaps[WINDOW_KEY] = window
        return cfg.fit_config, swaps

    def scoring(self, cell, cfg):
        return {"limit": cfg.limit, "eval_seeds": self.eval_seeds(cell["model"], cfg)}

    def control(self, records):
        """Full attention against SWA at B's window (or A's): the headroom without which no long-range model can
        win; none for the positive control's own row."""
        by_window = {parse_model(r["model"]): r["model"] for r in records}

        def control(a: str, b: str) -> tuple[str, str] | None:
            (va, wa), (vb, wb) = parse_model(a), parse_model(b)
            full, swa = by_window.get((FULL.name, None)), by_window.get((SWA.name, wb or wa))
            return None if FULL.name in (va, vb) or full is None or swa is None else (full, swa)
        return control

    def report(self, cfg, records, out):
        parts = self.sections(records, cfg.comparisons, cfg.margins, cfg.models)
        missing = self.unpaired(records, cfg.comparisons or [])
        preface = ("A − B on the same items (validation blocks: NLL per token in nats, lower is better; tasks: "
                   "points), paired by training seed. ")
        compare = self.compare_lines(parts, cfg.margins, cfg.preregistered, preface=preface) + (
            [f"Not compared (a model this run leaves out): {', '.join(missing)}."] if missing else [])
        steps = (cfg.fit_overrides or {}).get("trainer.max_steps", "the fit config's")
        title = f"{steps} steps, training seeds {cfg.seeds}, {cfg.limit or 'all'} documents per task"
        seeds = self.eval_seed_counts(records)
        columns = {"sigma_sd": lambda m, o: self.sigma_sd(records, m, o.key),
                   "eval_seeds": lambda m, o: seeds.get(m, 1)}
        return Report(table=table(parts, cfg, records), compare="\n".join(compare) + "\n",
                      comparisons=[r for part in parts for r in part.comparisons],
                      rows=self.summary_rows(parts, columns),
                      figures={"table1.png": lambda path: self.seeds_figure(parts, path, lambda _, o: o.name, title)})


EXPERIMENT = Pretrain()


def main(argv: list[str] | None = None) -> list[dict]:
    return run_experiment(EXPERIMENT, argv)
