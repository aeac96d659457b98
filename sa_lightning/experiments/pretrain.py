"""``cli.py study pretrain``: Table 1 at micro scale, every variant beside its controls, over training seeds.

    python cli.py study pretrain [--config configs/study/pretrain.yaml] [--preset quick] [--seeds 0 1 2]
                                 [--models full sa@32 ...] [--limit N] [--set KEY=VALUE] [--out DIR]

Trains every cell, one (model, training seed), with ``cli.py fit`` on the embedded default (``configs/tiny.yaml``,
its variant, window and seed swapped; ``fit_overrides`` change it only in size). A model is ``<variant>@<w>``
(``swa@64``: SWA at twice the window, the equal-compute reference of the gated pair) or a variant without a window
(``full``). Each trained model is then scored item by item, and every item kept in its cell:

- validation: the NLL of each of the validation blocks (the same blocks in every cell, SA drawing σ as in
  validation);
- the shipped offline tasks (``shakespeare_lastword`` accuracy, ``shakespeare_choice`` acc_norm), through lm-eval
  with its per-document records (eval_samples 1, σ drawn per document from the evaluation seed).

A model that draws (SA, the random keys and their gated pairs) is scored once per evaluation σ seed
(``eval_seeds``), each with its own σ for every validation block and document; an item's score is its mean over
those draws, and each draw's records are kept (``scores_by_eval_seed``). A model that draws nothing is scored once.

At the end (written together, the previous set left whole on a failure), all through ``utils.trained``:
``table.md`` (Table 1's layout: each model's score per outcome, mean [95% interval] over the training seeds, a t
interval over each seed's mean over the items, their range under five seeds; then the spread over training seeds
and over σ seeds), ``compare.md``/``compare.json`` (per outcome: each model over its seeds, the configured
comparisons A − B paired by training seed with the verdict worded from the interval and the positive control's
headroom, and the power of the design), ``results.csv`` (one row per model and outcome) and ``table1.png`` (each
seed's score, the mean and its interval). A killed run resumes: each finished cell is in ``<out>/cells/``.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from itertools import product
from pathlib import Path
from typing import Any

import numpy as np

from ..attention import get_variant, sigma_seeds, variant_label
from ..attention.variants import FULL, SWA
from ..utils import runner, trained
from ..utils.report import head, row
from ..utils.stats import MIN_UNITS
from .base import Flag, Report
from .base import main as run_experiment
from . import ensemble
from .training import TrainedExperiment

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


def present(results: list[dict]) -> tuple[trained.Outcome, ...]:
    """The outcomes some cell of ``results`` scored (``repeat_nll`` and ``repeat_acc`` only where the data planted
    repeats)."""
    return tuple(o for o in OUTCOMES if any(o.key in r["scores"] for r in results))


#: the per-item metric of each lm-eval task
TASK_METRICS = {"shakespeare_lastword": "acc", "shakespeare_choice": "acc_norm"}


# ---- settings --------------------------------------------------------------------------------------
@dataclass
class PretrainConfig:
    """The study's config (``configs/study/pretrain.yaml``): what each field may hold.

    Args:
        models: ``<variant>@<window>`` or a variant without a window (``full``).
        seeds: training seeds; every model trains once per seed, paired by seed in the comparisons.
        jobs: cells trained at once (a count, or ``auto``).
        fit_config: the ``cli.py fit`` config every cell trains (its model, seed and window swapped in).
        fit_overrides: ``fit`` arguments for every cell (``trainer.max_steps: 160``).
        limit: documents of each offline task.
        eval_seeds: σ seeds a model that draws is scored under.
        comparisons: ``{a: <model>, b: <model>}`` each, A − B paired by training seed.
        margins: ``{column: δ}``: A − B is called equivalent within ±δ where two one-sided tests say so, and both
            models beat SWA by more than δ (the floor rule).
        preregistered: when and from what the margins were fixed, before the run (the report prints it).
        out: the output folder.
        ensemble: K > 1 trains the cells of one model that differ only in their seed K at a time as one batched model
            in this process (``experiments.ensemble``; jobs is then 1); 1 (the default) trains each seed alone.
    """

    models: list[str]
    seeds: list[int]
    jobs: int | str | None = None
    fit_config: str = "configs/tiny.yaml"
    fit_overrides: dict[str, Any] | None = None
    limit: int | None = None
    eval_seeds: list[int] | None = None
    comparisons: list[dict] | None = None
    margins: dict[str, float] | None = None
    preregistered: str | None = None
    out: str = "outputs/study/pretrain"
    ensemble: int | None = None


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


def check(cfg: PretrainConfig, given: dict) -> None:
    """Every model, seed, comparison and margin, before the first cell trains."""
    ensemble.check_size(cfg.ensemble)
    for name in cfg.models:
        parse_model(name)
    bad = [s for s in cfg.seeds if not isinstance(s, int) or isinstance(s, bool) or s < 0]
    if bad:
        raise ValueError(f"seeds must be integers >= 0, got {bad[0]!r}; nothing was trained.")
    cfg.seeds = runner.unique_seeds(cfg.seeds, "seeds")
    cfg.eval_seeds = runner.unique_seeds(cfg.eval_seeds or [0], "eval_seeds")
    for c in cfg.comparisons or []:
        if not isinstance(c, dict) or set(c) != {"a", "b"}:
            raise ValueError(f"each comparison is {{a: <model>, b: <model>}}, got {c!r}; nothing was trained.")
        parse_model(c["a"]), parse_model(c["b"])  # a comparison of a model this run leaves out is named, not run
    margins = cfg.margins or {}
    columns = [o.key for o in OUTCOMES]
    if not isinstance(margins, dict) or any(k not in columns or isinstance(v, bool) or not isinstance(v, (int, float))
                                            or not v > 0 for k, v in margins.items()):
        raise ValueError(f"margins maps a column ({', '.join(columns)}) to an equivalence margin > 0 in its unit "
                         f"(nats, points), got {margins!r}; nothing was trained.")


def cells(cfg: PretrainConfig) -> list[dict]:
    return [dict(model=m, seed=int(s)) for m, s in product(cfg.models, cfg.seeds)]


def cell_id(cell: dict) -> str:
    return f"{cell['model'].replace('@', '_w')}_s{cell['seed']}"


# ---- one cell --------------------------------------------------------------------------------------
def validation_items(model, dm, eval_seed: int = 0) -> dict[str, list[float]]:
    """Each validation block's mean NLL per token, in the validation order (``val_ppl``); where the data planted
    repeats (``data.repeats``), the text's tokens there and the copies' apart: their NLL (``repeat_nll``) and the
    share of them the model's top guess gets right (``repeat_acc``, the accuracy of recall). SA draws σ as
    validation does, from streams of its own for each ``eval_seed`` (0: validation's)."""
    import torch
    import torch.nn.functional as F

    from ..data.repeats import text_targets

    model.eval()
    model.eval_seed = eval_seed
    text, repeats, hits = [], [], []
    with torch.no_grad():
        for i, batch in enumerate(dm.val_dataloader()):
            inputs, targets = model.targets_of(batch)
            scores = model.eval_scores(inputs, model.val_stream(i)).float()
            nll = F.cross_entropy(scores.flatten(0, 1), targets.flatten(), reduction="none", ignore_index=-100)
            nll = nll.view(targets.shape)
            copy = batch["repeat"] if isinstance(batch, dict) and "repeat" in batch else None
            if copy is None:
                text += nll.mean(dim=1).tolist()
                continue
            plain = text_targets(batch)
            text += ((nll * plain).sum(dim=1) / plain.sum(dim=1)).tolist()
            repeats += ((nll * copy).sum(dim=1) / copy.sum(dim=1)).tolist()
            right = (scores.argmax(dim=-1) == targets) & copy
            hits += (right.sum(dim=1) / copy.sum(dim=1)).tolist()
    return {"val_ppl": text, **({"repeat_nll": repeats, "repeat_acc": hits} if repeats else {})}


def score_cell(cell: dict, spec: dict, cli, trained: float, steps: int) -> dict:
    """A trained cell's record, scored item by item (``cli``: its model and data, trained for ``steps`` steps in
    ``trained`` seconds, by its own fit or as a member of an ensemble of seeds, ``experiments.ensemble``)."""
    from ..eval.harness import run_tasks_with_items
    from ..eval.lm import SALM

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
    mean = {column: [round(float(x), 5) for x in np.mean([s[column] for s in by_seed], axis=0)]
            for column in by_seed[0]}
    return {**cell, "steps": steps, "train_seconds": round(trained, 1),
            "seconds": round(trained + time.perf_counter() - scoring, 1), "eval_seeds": list(spec["eval_seeds"]),
            "scores": mean, "scores_by_eval_seed": by_seed}


def eval_seeds(model: str, cfg: PretrainConfig) -> list[int]:
    """The evaluation σ seeds a model is scored under: the config's for a model that draws, the first alone else."""
    return sigma_seeds(parse_model(model)[0], cfg.eval_seeds or [0])


# ---- the report: through utils.trained -------------------------------------------------------------
def _score(values, column: str) -> float:
    """A run's score on ``column`` as it prints: the perplexity of the mean NLL, or the mean."""
    outcome = next(o for o in OUTCOMES if o.key == column)
    return outcome.value(float(np.mean(values)))


def sigma_sd(results: list[dict], model: str, column: str) -> float | None:
    """σ's own noise: the SD over evaluation σ seeds of a trained model's score, averaged over its training seeds
    (None for a model scored under one σ seed)."""
    sds = [float(np.std([_score(s[column], column) for s in r["scores_by_eval_seed"]], ddof=1))
           for r in results if r["model"] == model and len(r.get("scores_by_eval_seed") or []) > 1
           and all(column in s for s in r["scores_by_eval_seed"])]
    return float(np.mean(sds)) if sds else None


def label(model: str) -> str:
    variant, window = parse_model(model)
    return variant_label(variant) + (f" (w={window})" if window else "")


def style(model: str) -> tuple[str, str, str]:
    variant = get_variant(parse_model(model)[0])
    return variant.color, variant.marker, label(model)


def units(results: list[dict], column: str) -> "trained.Units":
    """{model: {training seed: items}} on ``column``, every run cut to the items all scored: one ``seed_everything``
    gives a seed's models the same initialisation and data order, so they pair seed by seed."""
    runs = [r for r in results if column in r["scores"]]
    width = min((len(r["scores"][column]) for r in runs), default=0)
    out: dict[str, dict[int, list[float]]] = {}
    for r in sorted(runs, key=lambda r: r["seed"]):
        out.setdefault(r["model"], {})[r["seed"]] = list(r["scores"][column][:width])
    return out


def sections(results: list[dict], comparisons: list[dict], margins: dict | None = None,
             models: list[str] | None = None) -> list[trained.Section]:
    """Per outcome some cell scored, ``utils.trained.report`` over the one setting of the run: each model over its
    training seeds (a t interval, a range under five), and A − B per configured comparison paired by seed, with
    ``margins`` ({column: δ}) for "equivalent within ±δ". Each comparison but the positive control's own has the
    headroom of full attention against SWA at B's window (or A's): without it no long-range variant can win."""
    margins = margins or {}
    by_window = {parse_model(r["model"]): r["model"] for r in results}
    pairs = [(c["a"], c["b"]) for c in comparisons]

    def control(a: str, b: str) -> tuple[str, str] | None:
        (va, wa), (vb, wb) = parse_model(a), parse_model(b)
        if FULL.name in (va, vb):  # the positive control's own row
            return None
        full, swa = by_window.get((FULL.name, None)), by_window.get((SWA.name, wb or wa))
        return None if full is None or swa is None else (full, swa)

    order = models or list(dict.fromkeys(r["model"] for r in results))
    return [trained.report({(): units(results, o.key)}, o, pairs, margin=margins.get(o.key), control=control,
                           order=order, threshold=COPIED if o.key == "repeat_nll" else None)
            for o in present(results)]


def unpaired(results: list[dict], comparisons: list[dict]) -> list[str]:
    """The configured comparisons this run cannot make: a model it leaves out, or no seed that trained both."""
    seeds = {m: {r["seed"] for r in results if r["model"] == m} for m in {r["model"] for r in results}}
    out = []
    for c in comparisons:
        if not {c["a"], c["b"]} <= set(seeds):
            out.append(f"{label(c['a'])} − {label(c['b'])}")
        elif not seeds[c["a"]] & seeds[c["b"]]:
            out.append(f"{label(c['a'])} − {label(c['b'])} (no training seed trained both)")
    return out


def eval_seed_counts(results: list[dict]) -> dict[str, int]:
    """Each model's count of evaluation σ seeds (the most any of its cells was scored under)."""
    out: dict[str, int] = {}
    for r in results:
        out[r["model"]] = max(out.get(r["model"], 1), len(r.get("eval_seeds") or [0]))
    return out


def table(parts: list[trained.Section], cfg: PretrainConfig, results: list[dict]) -> str:
    """``table.md``: Table 1's layout (a model a row, an outcome a column, mean [95% over training seeds]), then the
    spread of each score over training seeds and over evaluation σ seeds."""
    models = list(dict.fromkeys(r["arm"] for part in parts for r in part.summaries))
    eval_seeds_of = eval_seed_counts(results)
    lines = trained.wide_table(parts, models, label=label, extra={"σ seeds": lambda m: eval_seeds_of.get(m, 1)})
    by = {(part.outcome.key, r["arm"]): r for part in parts for r in part.summaries}

    def sd(value, outcome) -> str:
        return "–" if value is None else f"{value:{outcome.spec}}"

    spread = head(["Model", *(f"{p.outcome.name}: {kind}" for p in parts for kind in ("training", "σ"))],
                  ["---"] + ["---:"] * 2 * len(parts))
    for m in models:
        spread.append(row([label(m), *(cell for p in parts for cell in (
            trained.shown_sd(by[(p.outcome.key, m)], p.outcome) if (p.outcome.key, m) in by else "–",
            sd(sigma_sd(results, m, p.outcome.key), p.outcome)))]))
    seeds = cfg.eval_seeds or [0]
    note = (f"Each score is mean [95% interval] over the training seeds {cfg.seeds}: a t interval over each "
            f"seed's mean over the items (validation blocks, task documents), since a training seed moves every item "
            f"of its model at once; with fewer than {MIN_UNITS} seeds there is no 95% interval, and the cell shows "
            f"the range of the seeds' scores instead. A model that draws σ (or random keys) is scored under the "
            f"evaluation σ seeds {seeds}, and each item's score is its mean over them, so σ's noise is inside the "
            "interval. Val. PPL: the interval of the mean NLL per block, as a perplexity (with repeats planted: the "
            "text's own targets, neither the planted segments nor their copies). LW: last-word accuracy (%); MC: "
            "four-way choice acc_norm (%), chance 25%. NLL on the repeats: nats per token on the planted copies that "
            "only a look back over the gap predicts (``data.repeats``).")
    return "\n".join(lines + ["", note, "", "Spread: the SD over training seeds of each trained model's score "
                              "(training), and the SD over evaluation σ seeds of one trained model's score, averaged "
                              "over its training seeds (σ):", "", *spread]) + "\n"


def compare(parts: list[trained.Section], results: list[dict], comparisons: list[dict],
            margins: dict | None = None, preregistered: str | None = None) -> tuple[str, list[dict]]:
    """``compare.md`` (per outcome, ``utils.trained.markdown``: each model over its seeds, the comparisons paired by
    seed, the power) and its rows for ``compare.json``."""
    lines: list[str] = []
    for part in parts:
        if part.comparisons:
            copies = part.outcome.key == "repeat_nll"
            lines += trained.markdown(part, [], label=label, margin=(margins or {}).get(part.outcome.key),
                                      threshold_label=f"seeds that copy (≤ {COPIED:g} nat)" if copies else None)
    note = ("A − B on the same items (validation blocks: NLL per token in nats, lower is better; tasks: points), "
            "paired by training seed. " + trained.NOTE
            + trained.margins_line(margins, preregistered))
    missing = unpaired(results, comparisons)
    if missing:
        note += f" Not compared (a model this run leaves out): {', '.join(missing)}."
    rows_ = [r for part in parts for r in part.comparisons]
    return "\n".join([*lines[1:], "", note]) + "\n", rows_


def csv_rows(parts: list[trained.Section], results: list[dict]) -> list[dict]:
    """``results.csv``: one row per (model, outcome), the numbers as they print (a perplexity for validation)."""
    out = []
    eval_seeds_of = eval_seed_counts(results)
    for part in parts:
        o = part.outcome
        for r in part.summaries:
            out.append({"model": r["arm"], "outcome": o.key, "mean": o.value(r["mean"]),
                        "lo": None if r.get("lo") is None else o.value(r["lo"]),
                        "hi": None if r.get("hi") is None else o.value(r["hi"]), "form": r.get("form"),
                        "seeds": r["seeds"], "items_all_seeds": r.get("items"),
                        "per_seed": " ".join(f"{o.value(v):.6g}" for v in r["per_seed"].values()),
                        "seed_sd": trained.seed_sd(r, o), "sigma_sd": sigma_sd(results, r["arm"], o.key),
                        "eval_seeds": eval_seeds_of.get(r["arm"], 1)})
    return out


def plot(parts: list[trained.Section], path: Path, cfg: PretrainConfig | None = None) -> None:
    """``table1.png``: one panel per outcome, each model's seeds (dots) and mean with its interval over them
    (``utils.trained.figure``), the run's setting in the title."""
    panels = [p for part in parts for p in trained.panels(part, lambda _, o=part.outcome: o.name)]
    title = ""
    if cfg is not None:
        steps = (cfg.fit_overrides or {}).get("trainer.max_steps", "the fit config's")
        title = (f"{steps} steps, training seeds {cfg.seeds}, {cfg.limit or 'all'} documents per "
                 "task")
    trained.figure(panels, path, style, title)


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
    check = staticmethod(check)
    cells = staticmethod(cells)
    cell_id = staticmethod(cell_id)
    line = staticmethod(line)

    score_cell = staticmethod(score_cell)

    def fit_swaps(self, cell, cfg):
        variant, window = parse_model(cell["model"])
        swaps = {"model.arch.attention.variant": variant, "seed_everything": cell["seed"]}
        if window is not None:
            swaps["model.arch.attention.window"] = window
        return cfg.fit_config, swaps

    def scoring(self, cell, cfg):
        return {"limit": cfg.limit, "eval_seeds": eval_seeds(cell["model"], cfg)}

    def report(self, cfg, records, out):
        parts = sections(records, cfg.comparisons or [], cfg.margins, cfg.models)
        compared, comparison_rows = compare(parts, records, cfg.comparisons or [], cfg.margins, cfg.preregistered)
        return Report(table=table(parts, cfg, records), compare=compared, comparisons=comparison_rows,
                      rows=csv_rows(parts, records), figures={"table1.png": lambda path: plot(parts, path, cfg)})


EXPERIMENT = Pretrain()


def main(argv: list[str] | None = None) -> list[dict]:
    return run_experiment(EXPERIMENT, argv)
