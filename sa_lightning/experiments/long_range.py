"""``cli.py study long-range``: does a trained SA model use its long routes?

    python cli.py study long-range [--config configs/study/long_range.yaml]
                                   [--preset quick|pilot|powered|decide-l4|mqar|grid|...]
                                   [--eval_samples 1 4 16] [--ensemble K] [--set KEY=VALUE] [--out DIR]

Each cell, one (task, variant, depth, window, training seed), trains the synthetic recall config
(``configs/synthetic/<task>.yaml``) with ``cli.py fit``, then is validated once per ``eval_samples`` K (K draws
averaged) and, at K = 1, once per evaluation σ seed for a model that draws. Every answer is kept as (key–query
distance, right or not) with its log-probability, so accuracy past SWA's receptive field L·(w−1) pairs answer by
answer and over training seeds. The report (``experiments.training``'s shared one, over training seeds, then each
trained model alone): ``table.md`` (accuracy per distance bucket per cell, ``eval.recall``),
``compare.md``/``compare.json``, ``reach.md`` (the depth at which each variant passes 90% beyond the field, beside
what its mask can reach), ``accuracy_vs_distance.png`` and ``over_seeds.png``. Each preset writes its own folder
(``out``).
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from ..analysis.mechanism import PATTERNED
from ..attention import get_variant, variant_names
from ..attention.variants import FULL, SWA
from ..eval.recall import (TARGET, answers, beyond, beyond_logps, far_buckets, learned_step, learning_curve, plot, rows,
                           several_seeds, table)
from ..utils import trained
from ..utils.report import head, row
from .base import Flag, Report
from .base import main as run_experiment
from .training import VARIANT_KEY, WINDOW_KEY, TrainedConfig, TrainedExperiment

GRID_KEYS = ("tasks", "variants", "depths", "windows", "seeds")
SETTING = ("task", "L", "w", "K")
#: what a trained cell is scored on beyond SWA's receptive field: accuracy, and the answer's log-probability (a
#: continuous outcome that moves where accuracy sits at chance or at the ceiling)
OUTCOMES = (trained.Outcome("acc", "accuracy beyond L·(w−1)", scale=100, spec=".1f", unit="points"),
            trained.Outcome("logp", "log p(answer) beyond L·(w−1)", spec=".3f", unit="nats"))


@dataclass
class LongRangeConfig(TrainedConfig):
    """``configs/study/long_range.yaml`` (the shared fields: ``experiments.training.TrainedConfig``; a margin is in
    its outcome's unit: ``acc`` a fraction of answers, 0.05 is 5 points; ``logp`` nats).

    Args:
        tasks: synthetic tasks (``passkey``, ``mqar``), each trained from ``fit_config`` with ``{task}`` filled in.
        variants, depths, windows, seeds: the grid; every (task, variant, depth, window, seed) is one cell.
        eval_samples: K draws averaged at validation.
        seeds_by_variant: training seeds for some variants instead of ``seeds`` (the references need fewer seeds
            than the comparisons that decide: ``{full: [0, 1, 2], swa: [0, 1, 2]}``).
        out: the output folder.
    """

    tasks: list[str]
    variants: list[str]
    depths: list[int]
    windows: list[int]
    seeds: list[int]
    eval_samples: list[int] | None = None
    fit_config: str = "configs/synthetic/{task}.yaml"
    seeds_by_variant: dict[str, list[int]] | None = None
    out: str = "outputs/study/long_range"


# ---- one cell -------------------------------------------------------------------------------------
def score_cell(cell: dict, spec: dict, cli, trained: float, steps: int) -> dict:
    """A trained cell's record (``cli``: its model and data, trained for ``steps`` steps in ``trained`` seconds, by
    its own fit or as a member of an ensemble of seeds, ``experiments.ensemble``): its answers by distance at each K
    of ``spec["eval_samples"]`` under the σ seeds of ``spec["eval_seeds"]`` (``lit.items.score_recall``), and its
    learning curve beyond SWA's field. Returns what goes in ``cells/<id>.json``."""
    from ..lit.items import score_recall

    scoring = time.perf_counter()
    model, dm = cli.model, cli.datamodule
    seeds = list(spec.get("eval_seeds") or [0])
    scores = score_recall(model, dm, cli.trainer.accelerator, spec["eval_samples"], seeds)
    receptive_field = cell["depth"] * (cell["window"] - 1)
    curve = learning_curve(Path(spec["fit_args"][spec["fit_args"].index("--trainer.default_root_dir") + 1]) / "tb",
                           far_buckets(dm.bucket_names, receptive_field))
    return {**cell, "seq_len": dm.seq_len, "receptive_field": receptive_field,
            "steps": steps, "train_seconds": round(trained, 1),
            "seconds": round(trained + time.perf_counter() - scoring, 1), "edges": dm.task.edges,
            "eval_seeds": seeds if model.net.variant.draws else seeds[:1], "scores": scores, "curve": curve}


# ---- the views beside the shared report: the comparisons, the reach of each mask -----------------------
def scored_at(results: list[dict]):
    """``scored(task, L, w, variant, K)``: whether the variant was validated at K in that setting itself: K = 1
    always; a larger K only for a model that draws (the others stand in at K = 1 as the B side of a comparison,
    never as a row of their own)."""
    validated = {(r["task"], r["depth"], r["window"], r["variant"], k) for r in results for k in r["scores"]}
    return lambda task, depth, window, variant, k: k == 1 or (task, depth, window, variant, k) in validated


def unpaired_answers(results: list[dict], pairs: list[tuple[str, str]]) -> list[str]:
    """The configured comparisons whose two cells of one seed both trained but cannot be paired at K = 1 (an answer
    list missing, or other answers)."""
    paired, by = answers(results, 1, "acc"), {(r["task"], r["depth"], r["window"], r["seed"], r["variant"])
                                              for r in results}
    return [f"{task} L={depth} w={window} seed {seed}: {a} against {b}"
            for task, depth, window, seed, variant in sorted(by) for a, b in pairs
            if variant == a and (task, depth, window, seed, b) in by
            and not all(seed in paired.get((task, depth, window), {}).get(arm, {}) for arm in (a, b))]


def compare(results: list[dict], comparisons: list[dict], margins: dict | None = None,
            preregistered: str | None = None, sections: list[trained.Section] | None = None) -> str:
    """``compare.md``: where two or more training seeds trained a setting, the report over training seeds
    (``TrainedExperiment.compare_lines``: each variant, the seeds that learned and when, A − B paired by seed, the
    power); then each trained model alone, A − B on one seed's validation answers beyond SWA's field
    (``utils.trained.within_seed``) per comparison and K of A (B at K, or at 1 if it draws nothing). ``sections``:
    those of these results, comparisons and margins where the caller made them already."""
    pairs = [(c["a"], c["b"]) for c in comparisons]
    if sections is None:
        sections = EXPERIMENT.sections(results, comparisons, margins)
    notes = {"acc": learned_line(sections[0])} if sections and sections[0].summaries else {}
    lines = EXPERIMENT.compare_lines(sections, margins, preregistered, notes)
    accuracy, alone, scored = OUTCOMES[0], [], scored_at(results)
    for k in sorted({k for r in results for k in r["scores"]}):
        for setting, arms in sorted(answers(results, k, accuracy.key).items()):
            own = [(a, b) for a, b in pairs if scored(*setting, a, k)]
            alone += [{**r, "setting": (*setting, k)} for r in trained.within_seed(
                arms, own, accuracy, control=(FULL.name, SWA.name), key=setting)]
    alone_lines = trained.within_seed_table(alone, accuracy, list(SETTING)) + [
        "", trained.WITHIN_NOTE + " Here the items are the validation answers beyond SWA's receptive field L·(w−1), "
        "each answer of a model that draws counted as its mean over the evaluation σ seeds at K = 1."]
    missing = unpaired_answers(results, pairs)
    if missing:
        alone_lines += ["", "Not compared (a cell saved without its answers, or validated on other data; run it "
                        "again): " + "; ".join(missing) + "."]
    return "\n".join([*lines, *(["", "## Each trained model alone", ""] if lines else []), *alone_lines]) + "\n"


def learned_line(section: trained.Section) -> str:
    first = min(r["setting"][3] for r in section.summaries)
    return ("Seeds that learned: accuracy beyond L·(w−1) of at least 90% at the end; the step at which each first "
            "did (validation during training): "
            + "; ".join(f"{r['arm']} (L={r['setting'][1]}, w={r['setting'][2]}): "
                        + ("no validation curve kept" if r["learned_steps"] is None else
                           ", ".join(map(str, r["learned_steps"])) or "none")
                        for r in section.summaries if r["setting"][3] == first) + ".")


def reach(results: list[dict]) -> str:
    """Per (task, variant, window): the first depth whose accuracy beyond L * (w - 1) reaches 90%, beside
    the coverage analysis's prediction for that depth (``cli.py analyze coverage``, causal convention) and the share
    of the distances past the field that the variant's own mask carries to the last query through L layers
    (``mechanism.reach_share``): a control that cannot reach them cannot stand against SA there."""
    from ..analysis.mechanism import coverage_curve, reach_share

    seeded = several_seeds(results)
    lines = head(["task", "variant", "w", *(["seed"] if seeded else []), "K", "depth reaching 90% beyond L·(w−1)",
                  "beyond-RF accuracy by depth", "coverage by depth (`analyze coverage`, causal)",
                  "mask reaches past the field, by depth"],
                 ["---", "---", "---:", *(["---:"] if seeded else []), "---:", "---", "---", "---", "---"])
    keyed: dict[tuple, dict[int, dict]] = {}
    for r in results:
        keyed.setdefault((r["task"], r["variant"], r["window"], r["seed"]), {})[r["depth"]] = r
    for (task, variant, window, seed), by_depth in sorted(keyed.items()):
        depths = sorted(by_depth)
        n = by_depth[depths[0]]["seq_len"]
        patterned = variant in PATTERNED and get_variant(variant).sparse
        cover = coverage_curve(variant, n, window, max(depths), convention="causal", trials=4, seed=seed) \
            if patterned else None
        reached = ", ".join(f"L={d}: {100 * reach_share(variant, n, window, d, d * (window - 1) + 1, trials=4):.0f}%"
                            for d in depths) if patterned else "–"
        for k in sorted({k for r in by_depth.values() for k in r["scores"]}):
            acc = {d: beyond(by_depth[d], k) for d in depths if k in by_depth[d]["scores"]}
            first = next((d for d in depths if acc.get(d, 0) >= TARGET), None)
            acc_text = ", ".join(f"L={d}: {100 * a:.0f}%" for d, a in acc.items())
            cov_text = ", ".join(f"L={d}: {100 * float(cover[d]):.0f}%" for d in depths) if cover is not None else "–"
            lines.append(row([task, variant, window, *([seed] if seeded else []), k,
                              first or f"not within {max(depths)}", acc_text, cov_text, reached]))
    return "\n".join(lines) + "\n"


# ---- the experiment -------------------------------------------------------------------------------
def line(result: dict) -> str:
    logps, learned = beyond_logps(result, min(result["scores"])) or [], learned_step(result)
    return "acc/beyond-RF " + "  ".join(f"K={k}: {100 * v['acc']:.1f}%/{100 * beyond(result, k):.1f}%"
                                        for k, v in sorted(result["scores"].items())) + \
        (f", log p beyond-RF {sum(logps) / len(logps):.3f}" if logps else "") + \
        (f", learned at step {learned}" if learned is not None else "")


class LongRange(TrainedExperiment):
    name = "study long-range"
    config = LongRangeConfig
    config_file = "configs/study/long_range.yaml"
    presets_note = "quick: <= 5 min on 2 CPU cores"
    folders = "outputs/study/long_range, long_range_quick, long_range_grid, long_range_paper_scale"
    flags = (Flag("eval_samples", "K permutations averaged at evaluation (SA)", int),
             *(Flag(key, f"override the config's {key}", str if key in ("tasks", "variants") else int)
               for key in GRID_KEYS))
    required = GRID_KEYS
    grid = (("task", "tasks"), ("variant", "variants"), ("depth", "depths"), ("window", "windows"))
    swaps = {VARIANT_KEY: "variant", "model.arch.n_layer": "depth", WINDOW_KEY: "window", "seed_everything": "seed"}
    outcomes = OUTCOMES
    setting = SETTING
    thresholds = {"acc": (TARGET, "seeds that learned")}
    line = staticmethod(line)
    score_cell = staticmethod(score_cell)

    def label(self, arm):  # the tables name a variant as the grid does
        return arm

    def style(self, arm):
        spec = get_variant(arm)
        return spec.color, spec.marker, spec.label

    def check_grid(self, cfg):
        """Beside the shared checks (``TrainedExperiment.check``): K, depths and windows, before each cell's fit."""
        cfg.eval_samples = cfg.eval_samples or [1]
        for key, values in (("eval_samples", cfg.eval_samples), ("depths", cfg.depths), ("windows", cfg.windows)):
            bad = [v for v in values if not isinstance(v, int) or isinstance(v, bool) or v < 1]
            if bad:
                raise ValueError(f"{key} must be integers >= 1, got {bad[0]!r} in {values!r}; nothing was trained.")

    def cell_id(self, cell):
        return f"{cell['task']}_{cell['variant']}_L{cell['depth']}_w{cell['window']}_s{cell['seed']}"

    def scoring(self, cell, cfg):
        return {"eval_samples": sorted(set(cfg.eval_samples)), "eval_seeds": self.eval_seeds(cell["variant"], cfg)}

    def loaded(self, saved):
        return {**saved, "scores": {int(k): v for k, v in saved["scores"].items()}}

    def units(self, records, outcome):
        """Per (task, L, w, K) that two or more training seeds trained: each variant's answers beyond SWA's field."""
        ks = sorted({k for r in records for k in r["scores"]})
        return {(*setting, k): arms for k in ks for setting, arms in answers(records, k, outcome.key).items()
                if max(len(seeds) for seeds in arms.values()) >= 2}

    def sections(self, records, comparisons=None, margins=None, order=None):
        """The shared sections in the registry's order, less the rows at K > 1 of the models that draw nothing (as
        B they stand in at K = 1); each variant's row carries the steps at which its seeds learned."""
        scored = scored_at(records)
        out = super().sections(records, comparisons, margins, order or list(variant_names()))
        for section in out:
            section.summaries[:] = [e for e in section.summaries if scored(*e["setting"][:3], e["arm"],
                                                                             e["setting"][3])]
            section.comparisons[:] = [e for e in section.comparisons if scored(*e["setting"][:3], e["a"],
                                                                                 e["setting"][3])]
            for entry in section.summaries:
                task, depth, window, _ = entry["setting"]
                cells = [r for r in records if (r["task"], r["depth"], r["window"], r["variant"])
                         == (task, depth, window, entry["arm"]) and r["seed"] in entry["per_seed"]]
                # a cell saved before curves were kept says nothing about when it learned
                entry["learned_steps"] = sorted(s for s in map(learned_step, cells) if s is not None) \
                    if all(r.get("curve") for r in cells) else None
        return out

    def report(self, cfg, records, out):
        parts = self.sections(records, cfg.comparisons, cfg.margins)
        # the arms alone (their summaries do not depend on the comparisons): each seed a dot at K = 1
        at_one = [trained.Section(s.outcome, [r for r in s.summaries if r["setting"][3] == 1], []) for s in parts]
        size = "; ".join(f"n = {n}, {steps} training steps" for n, steps in sorted({(r["seq_len"], r["steps"])
                                                                                   for r in records}))
        title = f"{size}, validated at K = 1 under {max(len(r.get('eval_seeds') or [0]) for r in records)} σ seed(s)"
        flat = rows(records)  # results.csv's rows, which the table shows
        return Report(table=table(records, flat),
                      compare=compare(records, cfg.comparisons or [], cfg.margins, cfg.preregistered, parts),
                      comparisons=[r for s in parts for r in s.comparisons],
                      rows=flat, views={"reach.md": reach(records)},
                      figures={"accuracy_vs_distance.png": lambda path: plot(records, path),
                               "over_seeds.png": lambda path: several_seeds(records) and self.seeds_figure(
                                   at_one, path, lambda s, o: f"{s[0]}, L={s[1]}, w={s[2]}: {o.name}", title)})


EXPERIMENT = LongRange()


def main(argv: list[str] | None = None) -> list[dict]:
    return run_experiment(EXPERIMENT, argv)
