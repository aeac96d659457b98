"""What every experiment that trains models shares (``TrainedExperiment``): each cell is a ``cli.py fit`` line, its
spec names the bytes of every file that line reads, and the loop trains the cells one by one or ``jobs`` at a
time in worker processes. A cell whose record was made with the same ``fit`` arguments but other scoring settings
(more σ seeds at evaluation, say) is not trained again: its model comes back from its last checkpoint
(``trained_checkpoint``) and only the scoring runs.

Their reports share one shape (``utils.trained``): each experiment gives its outcomes and, per outcome, its units
(``{setting: {arm: {training seed: items}}}``); the sections over training seeds, the comparisons' markdown and the
figure of each seed's score are made here."""
from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from itertools import product
from pathlib import Path
from typing import Any, Callable

from ..attention import get_variant, sigma_seeds, variant_label
from ..attention.registry import KERNEL_ROUTES
from ..attention.variants import FULL, SWA
from ..utils import runner, trained
from ..utils.argtypes import key_values
from ..utils.quiet import quiet_lightning
from ..utils.report import head, row
from ..utils.yamlfile import load_yaml
from .base import Experiment

#: the ``fit`` arguments that name a cell's variant and window
VARIANT_KEY, WINDOW_KEY = "model.arch.attention.variant", "model.arch.attention.window"


@dataclass(kw_only=True)
class TrainedConfig:
    """What the config of every experiment that trains models holds beside its grid.

    Args:
        jobs: cells trained at once (a count, or ``auto``). fit_overrides: ``fit`` arguments for every cell.
        eval_seeds: σ seeds a model that draws is scored under (each item: its mean over them); one that draws
            nothing is scored under the first alone.
        comparisons: ``{a: <arm>, b: <arm>}`` each, A − B paired by training seed.
        margins: ``{outcome: δ}`` in the outcome's own unit, for "equivalent within ±δ" (two one-sided tests over
            training seeds), said only where both arms beat SWA by more than δ (the floor rule).
        preregistered: when and from what the margins were fixed, before the run (the report prints it); without it
            the report says the margins were not fixed in advance.
        ensemble: K > 1 trains the cells that differ only in their seed K at a time as one batched model in this
            process (``experiments.ensemble``; jobs is then 1); 1 (the default) trains each seed alone.
    """

    jobs: int | str | None = None
    fit_overrides: dict[str, Any] | None = None
    eval_seeds: list[int] | None = None
    comparisons: list[dict] | None = None
    margins: dict[str, float] | None = None
    preregistered: str | None = None
    ensemble: int | None = None


class TrainedExperiment(Experiment):
    """An experiment whose cells train a model each: ``fit_swaps`` gives a cell's ``cli.py fit`` config and swaps;
    the config has ``fit_config`` and ``fit_overrides`` (``--set KEY=VALUE``, repeatable, adds to them)."""

    announce = True
    #: the grid: (a cell's field, the config's list it runs over) in the cells' order; every cell trains once per
    #: training seed (``seeds``, or its arm's own in ``seeds_by_variant`` where the config has that field)
    grid: tuple[tuple[str, str], ...] = ()
    #: the cell's field that names its arm (a comparison's a or b)
    arm: str = "variant"
    #: the ``fit`` arguments a cell swaps into ``fit_config`` (its fields filled in by name: ``{task}``), each from one
    #: of its fields, in the fit line's order (``{"model.arch.n_layer": "depth"}``)
    swaps: dict[str, str] = {}
    #: what a cell is scored on (``utils.trained.Outcome``), in the report's order; a margin names one's key
    outcomes: tuple = ()
    #: a setting's fields as the tables name them (``task, L, w, K``); none where a run is one setting
    setting: tuple[str, ...] = ()
    #: ``{outcome key: (threshold, what the seeds past it did)}``: the seeds that learned, beside the mean
    thresholds: dict[str, tuple[float, str]] = {}

    # ---- the arms and the settings' check --------------------------------------------------------------
    def variant(self, arm: str) -> str:
        """The variant an arm (a comparison's a or b) trains, checked against the registry."""
        get_variant(arm)
        return arm

    def label(self, arm: str) -> str:
        return variant_label(self.variant(arm))

    def style(self, arm: str) -> tuple[str, str, str]:
        spec = get_variant(self.variant(arm))
        return spec.color, spec.marker, self.label(arm)

    def eval_seeds(self, arm: str, cfg) -> list[int]:
        """The σ seeds an arm is scored under: the config's for a model that draws, the first alone else."""
        return sigma_seeds(self.variant(arm), cfg.eval_seeds or [0])

    def check(self, cfg, given: dict) -> None:
        """The settings every trained experiment has, before the first cell trains (a bad one found after hours
        of training would waste them): the ensemble's size, the seeds (each once), the comparisons' arms and the
        margins' outcomes; then ``seeds_by_variant`` (``own_seeds``), the experiment's own grid (``check_grid``)
        and every cell's fit (``check_cells``)."""
        if cfg.ensemble is not None and cfg.ensemble < 1:
            raise ValueError(f"ensemble must be >= 1 (seeds trained as one model), got {cfg.ensemble}; nothing was "
                             "trained.")
        cfg.seeds = runner.unique_seeds(cfg.seeds, "seeds")
        cfg.eval_seeds = runner.unique_seeds(cfg.eval_seeds if cfg.eval_seeds is not None else [0], "eval_seeds")
        for c in cfg.comparisons or []:
            if not isinstance(c, dict) or set(c) != {"a", "b"}:
                raise ValueError(f"each comparison is {{a: <arm>, b: <arm>}}, got {c!r}; nothing was trained.")
            self.variant(c["a"]), self.variant(c["b"])  # a comparison of an arm this run leaves out is named, not run
        keys = [o.key for o in self.outcomes]
        margins = cfg.margins or {}
        bad = [f"{k}: {v!r}" for k, v in (margins.items() if isinstance(margins, dict) else [])
               if k not in keys or isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v < float("inf")]
        if not isinstance(margins, dict) or bad:  # .inf would make every comparison "equivalent": refused too
            raise ValueError(f"margins maps an outcome ({', '.join(keys)}) to a finite equivalence margin > 0 in its "
                             f"unit, got {', '.join(bad) if bad else repr(margins)}; nothing was trained.")
        if hasattr(cfg, "seeds_by_variant"):
            cfg.seeds_by_variant = self.own_seeds(cfg, cfg.seeds_by_variant or {}, given)
        self.check_grid(cfg)
        self.check_cells(cfg)

    def check_grid(self, cfg) -> None:
        """The experiment's own checks of its grid (and normalising it in place), before every cell's fit is."""

    def header(self, cfg, preset, out, todo) -> str:
        note = self.floor_note(cfg)
        said = super().header(cfg, preset, out, todo)
        if getattr(cfg, "preregistered", None) and preset:
            said += f"\npre-registered: {cfg.preregistered}; {preset_commit(self.config_file, preset)}"
        return said + (f"\nnote: {note}" if note else "")

    def floor_note(self, cfg) -> str | None:
        """Before the first cell, where the run has margins: the comparisons whose floor (an equivalence needs both
        arms to beat SWA by more than δ; the floor is the second arm of the row's positive control, ``control``, as
        the report takes it) trains fewer of the seeds the comparison pairs. Five SWA seeds against arms whose seeds
        spread widely cannot clear a margin that twenty clear (docs/results/long_range.md, Table 12c). None where
        every floor trains every paired seed."""
        if not cfg.margins:
            return None
        arms = getattr(cfg, dict(self.grid)[self.arm])
        control = self.control([{self.arm: arm} for arm in arms])  # the arms as the records will name them
        short, floorless = [], []
        for c in cfg.comparisons or []:
            a, b = c["a"], c["b"]
            if not {a, b} <= set(arms) or {self.variant(a), self.variant(b)} & {SWA.name, FULL.name}:
                continue  # an arm the run leaves out, or a row against the floor or the reference itself
            ctrl = control(a, b) if callable(control) else control
            floor = ctrl[1] if ctrl else None
            if floor not in arms:  # no floor trained: every verdict of the row will be "cannot decide"
                floorless.append((f"{self.label(a)} − {self.label(b)}", floor))
                continue
            paired = set(self.seeds_of(cfg, a)) & set(self.seeds_of(cfg, b))
            shared = len(paired & set(self.seeds_of(cfg, floor)))
            if paired and shared < len(paired):
                short.append(f"{self.label(a)} − {self.label(b)} ({shared} of its {len(paired)} seeds)")
        notes = []
        if floorless:
            # the floor is the second arm of the row's positive control: none where that control is not trained
            floors = ", ".join(dict.fromkeys(self.label(f) if f else "full attention and SWA at the row's window"
                                             for _, f in floorless))
            notes.append(
                f"margins are set, but the floor ({floors}) is not trained in this run, so "
                f"{', '.join(row for row, _ in floorless)} cannot be called equivalent: \"equivalent\" needs both "
                "arms to beat the floor by more than the margin, and the report will say \"cannot decide\" for want "
                f"of it; add {floors} to the run's {dict(self.grid)[self.arm]} to decide.")
        if short:
            notes.append(
                "the floor rule is judged over the seeds SWA trains, fewer than the comparison pairs for "
                + "; ".join(short) + ". Where an arm's seeds spread widely, a floor on few seeds may fail to clear the "
                "margin; train SWA on every seed the comparison judges (docs/results/long_range.md, Table 12c).")
        return "\nnote: ".join(notes) or None

    def own_seeds(self, cfg, own: dict, given: dict) -> dict[str, list[int]]:
        """``seeds_by_variant`` as this run trains it: narrowed by the command line's arms (a preset's seeds for the
        arms it leaves out no longer apply) and by its ``--seeds`` (every arm's seeds); each arm among the grid's."""
        arms = getattr(cfg, dict(self.grid)[self.arm])
        if given.get(dict(self.grid)[self.arm]):
            own = {arm: seeds for arm, seeds in own.items() if arm in arms}
        if given.get("seeds"):
            own = {arm: [s for s in seeds if s in cfg.seeds] for arm, seeds in own.items()}
        unknown = sorted(set(own) - set(arms))
        if unknown:
            raise ValueError(f"seeds_by_variant names {', '.join(unknown)}, not among the variants {arms!r}; "
                             "nothing was trained.")
        return {arm: runner.unique_seeds(seeds, f"seeds_by_variant.{arm}") for arm, seeds in own.items()}

    def check_cells(self, cfg) -> None:
        """Every point of the grid's fit, before the first cell trains: its window suits its variant (a control's
        least is 3), then its config is a file."""
        from ..attention import AttentionSpec

        fits = [self.fit_swaps({**point, "seed": 0}, cfg) for point in self.points(cfg)]  # the seed changes no check
        for _, swaps in fits:
            variant, window = swaps.get(VARIANT_KEY), swaps.get(WINDOW_KEY)
            if variant is not None and window is not None and get_variant(variant).windowed:
                AttentionSpec(variant, int(window))
        for config in dict.fromkeys(config for config, _ in fits):
            if not Path(config).is_file():
                raise ValueError(f"the fit config {config!r} is not a file; nothing was trained.")
            load_yaml(config, "the fit config")  # its YAML parses: else the file, line and column, before any cell

    # ---- the report over training seeds (``utils.trained``) -------------------------------------------
    def units(self, records: list[dict], outcome: trained.Outcome) -> dict[tuple, trained.Units]:
        """Per setting (a tuple of ``setting``'s fields), each arm's items on ``outcome`` per training seed. Here a
        run is one setting: ``{arm: {training seed: scores[outcome]}}``, every run cut to the items all scored (one
        ``seed_everything`` gives a seed's models the same initialisation and data order, so they pair seed by
        seed); none where no cell scored the outcome."""
        runs = [r for r in records if outcome.key in r["scores"]]
        width = min((len(r["scores"][outcome.key]) for r in runs), default=0)
        out: dict[str, dict[int, list[float]]] = {}
        for r in sorted(runs, key=lambda r: r["seed"]):
            out.setdefault(r[self.arm], {})[r["seed"]] = list(r["scores"][outcome.key][:width])
        return {(): out} if out else {}

    def unpaired(self, records: list[dict], comparisons: list[dict]) -> list[str]:
        """The configured comparisons this run cannot make: an arm it leaves out, or no seed that trained both."""
        seeds: dict[str, set] = {}
        for r in records:
            seeds.setdefault(r[self.arm], set()).add(r["seed"])
        out = []
        for c in comparisons:
            if not {c["a"], c["b"]} <= set(seeds):
                out.append(f"{self.label(c['a'])} − {self.label(c['b'])}")
            elif not seeds[c["a"]] & seeds[c["b"]]:
                out.append(f"{self.label(c['a'])} − {self.label(c['b'])} (no training seed trained both)")
        return out

    def summary_rows(self, sections: list[trained.Section], extra: dict[str, Callable] | None = None) -> list[dict]:
        """``results.csv``: one row per (arm, outcome), the numbers as they print (a perplexity, say), then the
        ``extra`` columns, each ``f(arm, outcome)``."""
        out = []
        for section in sections:
            o = section.outcome
            for r in section.summaries:
                out.append({self.arm: r["arm"], "outcome": o.key, "mean": o.value(r["mean"]),
                            "lo": None if r.get("lo") is None else o.value(r["lo"]),
                            "hi": None if r.get("hi") is None else o.value(r["hi"]), "form": r.get("form"),
                            "seeds": r["seeds"], "items_all_seeds": r.get("items"),
                            "per_seed": " ".join(f"{o.value(v):.6g}" for v in r["per_seed"].values()),
                            "seed_sd": trained.seed_sd(r, o),
                            **{name: f(r["arm"], o) for name, f in (extra or {}).items()}})
        return out

    def control(self, records: list[dict]):
        """The positive control whose headroom each comparison carries (``utils.trained.comparisons``)."""
        return FULL.name, SWA.name

    def sections(self, records: list[dict], comparisons: list[dict] | None = None, margins: dict | None = None,
                 order: list[str] | None = None) -> list[trained.Section]:
        """Per outcome some cell scored, each arm over its training seeds (in ``order`` where given) and A − B per
        comparison (``{a, b}``) paired by seed, with ``margins`` ({outcome: δ}) for "equivalent within ±δ"
        (``utils.trained.report``)."""
        pairs = [(c["a"], c["b"]) for c in comparisons or []]
        margins = margins or {}
        out = []
        for outcome in self.outcomes:
            units = self.units(records, outcome)
            if units:
                out.append(trained.report(units, outcome, pairs, margin=margins.get(outcome.key),
                                          control=self.control(records), order=order,
                                          threshold=self.thresholds.get(outcome.key, (None, ""))[0]))
        return out

    # ---- σ seeds: a model that draws is scored under each, an item counting as its mean over them ------------
    def sigma_sd(self, records: list[dict], arm: str, key: str) -> float | None:
        """σ's own noise: the SD over evaluation σ seeds of a trained model's score on outcome ``key`` (as it prints:
        a perplexity, say), averaged over the arm's training seeds; None for an arm scored under one σ seed. Reads
        records that keep each σ seed's items (``scores_by_eval_seed``, ``over_eval_seeds``)."""
        import numpy as np

        outcome = next(o for o in self.outcomes if o.key == key)
        sds = [float(np.std([outcome.value(float(np.mean(s[key]))) for s in r["scores_by_eval_seed"]], ddof=1))
               for r in records if r[self.arm] == arm and len(r.get("scores_by_eval_seed") or []) > 1
               and all(key in s for s in r["scores_by_eval_seed"])]
        return float(np.mean(sds)) if sds else None

    def eval_seed_counts(self, records: list[dict]) -> dict[str, int]:
        """Each arm's count of evaluation σ seeds (the most any of its cells was scored under)."""
        out: dict[str, int] = {}
        for r in records:
            out[r[self.arm]] = max(out.get(r[self.arm], 1), len(r.get("eval_seeds") or [0]))
        return out

    def spread_lines(self, sections: list[trained.Section], records: list[dict], arms: list[str]) -> list[str]:
        """The spread of each arm's score on each outcome: the SD over training seeds and the SD over σ seeds."""
        by = {(s.outcome.key, r["arm"]): r for s in sections for r in s.summaries}
        lines = ["Spread: the SD over training seeds of each trained model's score (training), and the SD over "
                 "evaluation σ seeds of one trained model's score, averaged over its training seeds (σ):", "",
                 *head(["Model", *(f"{s.outcome.name}: {kind}" for s in sections for kind in ("training", "σ"))],
                       ["---"] + ["---:"] * 2 * len(sections))]
        for arm in arms:
            cells = []
            for s in sections:
                sigma = self.sigma_sd(records, arm, s.outcome.key)
                cells += [trained.shown_sd(by[(s.outcome.key, arm)], s.outcome) if (s.outcome.key, arm) in by
                          else "–", "–" if sigma is None else f"{sigma:{s.outcome.spec}}"]
            lines.append(row([self.label(arm), *cells]))
        return lines

    def compare_lines(self, sections: list[trained.Section], margins: dict | None = None,
                      preregistered: str | None = None, notes: dict[str, str] | None = None,
                      preface: str = "") -> list[str]:
        """``compare.md``'s part over training seeds: each section's arms, comparisons and power (with the note
        ``notes`` holds for its outcome), then what the items are (``preface``), what every such table means and
        how the margins were fixed."""
        lines: list[str] = []
        margins = margins or {}
        for s in sections:
            passed = self.thresholds.get(s.outcome.key)
            lines += trained.markdown(s, list(self.setting), label=self.label, margin=margins.get(s.outcome.key),
                                      threshold_label=passed[1] if passed else None,
                                      note=(notes or {}).get(s.outcome.key))
        if lines:
            lines = [*lines[1:], "", preface + trained.NOTE + trained.margins_line(margins, preregistered)]
        return lines

    def seeds_figure(self, sections: list[trained.Section], path: Path, name: Callable[[tuple, trained.Outcome], str],
                     title: str) -> bool:
        """Each arm's training seeds (dots) and their mean with its interval, one panel per (outcome, setting)
        (``utils.trained.figure``). Whether there was a panel to draw."""
        panels = [p for s in sections for p in trained.panels(s, lambda setting, o=s.outcome: name(setting, o))]
        if panels:
            trained.figure(panels, path, self.style, title)
        return bool(panels)

    # ---- the cells ----------------------------------------------------------------------------------------
    def parser(self):
        parser = super().parser()
        parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                            help="a fit argument for every cell, e.g. --set trainer.max_steps=100 (repeatable)")
        parser.add_argument("--ensemble", type=int, metavar="K",
                            help="train the cells that differ only in their seed K at a time as one batched model in "
                                 "one process, each member as its seed alone; one that runs out of GPU memory trains "
                                 "as its halves (default: the config's, else 1: each alone)")
        return parser

    def overrides(self, args):
        return {**super().overrides(args), "ensemble": args.ensemble}

    def settings(self, args):
        cfg = super().settings(args)
        if args.set:
            cfg.fit_overrides = {**(cfg.fit_overrides or {}), **key_values(args.set)}
        return cfg

    def seeds_of(self, cfg, arm: str) -> list[int]:
        """An arm's training seeds: its own in ``seeds_by_variant``, else ``seeds``."""
        return (getattr(cfg, "seeds_by_variant", None) or {}).get(arm, cfg.seeds)

    def points(self, cfg) -> list[dict]:
        """The grid's points, each a cell without its seed, in the grid's order."""
        fields = [field for field, _ in self.grid]
        return [dict(zip(fields, values)) for values in product(*(getattr(cfg, key) for _, key in self.grid))]

    def cells(self, cfg) -> list[dict]:
        """Every point of the grid once per training seed, seed by seed (a run stopped part-way holds whole seeds of
        every arm, which pair)."""
        cells = [{**point, "seed": int(seed)} for point in self.points(cfg)
                 for seed in self.seeds_of(cfg, point[self.arm])]
        return sorted(cells, key=lambda c: c["seed"])  # stable: the grid's order within a seed

    def fit_swaps(self, cell, cfg) -> tuple[str, dict]:
        """The ``fit`` config a cell trains and what it swaps in (variant, window, seed, ...)."""
        return cfg.fit_config.format(**cell), {key: cell[field] for key, field in self.swaps.items()}

    def fit_args(self, cell, cfg, folder: Path) -> list[str]:
        config, swaps = self.fit_swaps(cell, cfg)
        return fit_args(config, swaps, cfg.fit_overrides, folder)

    def scoring(self, cell, cfg) -> dict:
        """The rest of a cell's spec: what scores the trained model."""
        return {}

    def spec(self, cell, cfg, out: Path) -> dict:
        args = self.fit_args(cell, cfg, out / "runs" / self.cell_id(cell))
        # the outcomes it scores: a new one makes every finished cell score again from its checkpoint (``given``),
        # never a column left empty or partial by cells scored before it
        spec = {"fit_args": args, "kernels": KERNEL_ROUTES, **variant_revision(args), **self.scoring(cell, cfg),
                "outcomes": [o.key for o in self.outcomes]}
        inputs = config_fingerprint(args)
        return spec if inputs is None else {**spec, "inputs": inputs}

    def reuse(self, saved: dict, spec: dict) -> bool:
        """The one reuse rule on the spec's portable form (``portable``): the cell's run folder counts by its own
        part, so a study folder that was moved, copied or named another way (relative or absolute) keeps its
        cells."""
        return portable(saved.get("spec") or {}) == portable(spec)

    def given(self, cell, saved: dict, spec: dict) -> dict:
        trained = trained_checkpoint(saved, spec)
        if trained is None:
            return spec
        print(f"{self.cell_id(cell)}: trained before with the same fit arguments; scored again from its last "
              "checkpoint, not trained", flush=True)
        return {**spec, "trained": trained}

    # ---- cells that differ only in their seed, K at a time as one ensemble (``experiments.ensemble``) ---------
    ensembles = None

    def before(self, cfg, out: Path, todo: list) -> None:
        from .ensemble import EnsembleRun

        size = getattr(cfg, "ensemble", None) or 1
        self.ensembles = None
        if size > 1:
            print(f"ensembles of up to {size} training seeds per setting, one ensemble at a time in this process",
                  flush=True)
            jobs = getattr(cfg, "jobs", None)
            if isinstance(jobs, int) and jobs > 1:
                print(f"jobs {jobs} is not used with ensembles: jobs is 1 (an ensemble trains in this process with "
                      "every thread, and its members' records come from the one that trained them)", flush=True)
            self.ensembles = EnsembleRun(todo, out, self.cell_id, lambda cell: self.spec(cell, cfg, out), size,
                                         self.score_cell, self.run_alone, reuse=self.reuse)

    def jobs(self, cfg):
        return 1 if (getattr(cfg, "ensemble", None) or 1) > 1 else cfg.jobs

    def run(self, cell, spec: dict) -> dict:
        return self.ensembles(cell, spec) if self.ensembles is not None else self.run_alone(cell, spec)

    def run_alone(self, cell, spec: dict) -> dict:
        """Train the cell alone (``fit_cell``), then score it (``score_cell``)."""
        cli, trained = fit_cell(spec)
        return self.score_cell(cell, spec, cli, trained, int(cli.trainer.global_step))

    def score_cell(self, cell, spec: dict, cli, trained: float, steps: int) -> dict:
        """A trained cell's record: ``cli`` (its model and data) trained for ``steps`` steps in ``trained`` seconds."""
        raise NotImplementedError

    def setup(self) -> None:
        """A worker's start: the command line's quiet output for ``fit``, and no progress bars (lm-eval's, the
        datasets'): several workers' bars share the terminal with the runner's lines, which they would cut into."""
        os.environ["TQDM_DISABLE"] = "1"
        quiet_lightning("fit")


def over_eval_seeds(by_seed: list[dict[str, list[float]]]) -> dict:
    """A record's scores from its scoring under each σ seed (``{outcome: items}`` per seed, the same items in each):
    each item its mean over the seeds (``scores``), each seed's kept (``scores_by_eval_seed``)."""
    import numpy as np

    mean = {key: [round(float(x), 5) for x in np.mean([s[key] for s in by_seed], axis=0)] for key in by_seed[0]}
    return {"scores": mean, "scores_by_eval_seed": by_seed}


def fit_args(config: str, swaps: dict, overrides: dict | None, folder: Path) -> list[str]:
    """The ``cli.py fit`` command line of one cell: ``config`` with the cell's ``swaps`` (variant, window, seed,
    ...), then the experiment's ``fit_overrides``, quiet, under ``folder``."""
    args = ["fit", "--config", config]
    for key, value in {**swaps, "trainer.default_root_dir": folder, "trainer.enable_progress_bar": "false",
                       "trainer.enable_model_summary": "false", **(overrides or {})}.items():
        args += [f"--{key}", str(value)]
    return args


def variant_revision(args: list) -> dict:
    """``{"revision": r}`` for a fit line whose variant's semantics are past their first (``Variant.revision``: its
    pattern changed, as the controls' did for the model's depth), so a cell trained under the old ones is trained
    again, not reused; {} for every other variant, whose cells keep the specs they had."""
    flag = f"--{VARIANT_KEY}"
    names = [str(args[i + 1]) for i, arg in enumerate(args[:-1]) if arg == flag]
    revision = get_variant(names[-1]).revision if names else 1
    return {"revision": revision} if revision > 1 else {}


def portable(spec: dict) -> dict:
    """``spec`` with its fit line's run folder (``--trainer.default_root_dir <out>/runs/<cell id>``) cut to its last
    two parts: where the study folder lies is not an input that makes the cell."""
    args = [str(a) for a in spec.get("fit_args") or []]
    if "--trainer.default_root_dir" not in args[:-1]:
        return spec
    i = args.index("--trainer.default_root_dir") + 1
    args[i] = "/".join(Path(args[i]).parts[-2:])
    return {**spec, "fit_args": args}


def trained_checkpoint(saved: dict, spec: dict) -> dict | None:
    """What a cell's earlier run trained, when this run would train it the same way: the record ``saved`` was made
    with the same ``fit_args`` (their ``portable`` form) and inputs (the bytes of the files they name), and the
    cell's folder (``--trainer.default_root_dir`` of this run's spec) still holds a ``last.ckpt`` at the step the
    record names.
    ``{"checkpoint", "steps", "train_seconds"}``, or None (train it)."""
    import torch

    args = [str(a) for a in spec.get("fit_args") or []]
    kept = (saved or {}).get("spec") or {}
    if not args or portable(kept).get("fit_args") != portable(spec).get("fit_args") \
            or kept.get("inputs") != spec.get("inputs") or kept.get("kernels") != spec.get("kernels") \
            or kept.get("revision") != spec.get("revision") \
            or "--trainer.default_root_dir" not in args[:-1]:
        return None
    folder = Path(args[args.index("--trainer.default_root_dir") + 1])
    found = sorted(folder.glob("tb/version_*/checkpoints/last.ckpt"), key=lambda p: p.stat().st_mtime)
    if not found:
        return None
    try:
        # memory-mapped: only the step is read, not a large model's weights and optimizer state
        step = torch.load(found[-1], map_location="cpu", weights_only=True, mmap=True).get("global_step")
    except Exception:  # a damaged checkpoint: train again
        return None
    if step is None or step != saved.get("steps"):
        return None
    return {"checkpoint": str(found[-1]), "steps": int(step), "train_seconds": saved.get("train_seconds")}


def fit_cell(spec: dict):
    """``cli.py fit`` with the spec's ``fit_args`` (a cell's trained model: the CLI, its model and data), and the
    seconds it trained. With ``spec["trained"]`` (``trained_checkpoint``) the fit resumes from that checkpoint,
    already at its last step, so nothing trains and the seconds are the earlier run's."""
    from ..lit.cli import run as run_cli

    start = time.perf_counter()
    trained = spec.get("trained")
    args = list(spec["fit_args"]) + (["--ckpt_path", trained["checkpoint"]] if trained else [])
    if "--trainer.default_root_dir" in args[:-1]:  # a line every 30 s from the quiet fit (not in the spec: no retrain)
        folder = Path(args[args.index("--trainer.default_root_dir") + 1])
        args.append("--trainer.callbacks+=" + json.dumps({"class_path": "sa_lightning.lit.callbacks.Heartbeat",
                                                           "init_args": {"label": folder.name}}))
        if not trained:
            from ..lit.resume import find_last_checkpoint

            if find_last_checkpoint(str(folder))[0] is not None:
                print(f"{folder.name}: its folder holds an earlier run of this cell (cut short, or made with other fit "
                      "arguments); the cell trains again from step 0, in a new logger version beside it", flush=True)
    cli = run_cli(args, run=True, note_earlier=False)
    seconds = trained["train_seconds"] if trained and trained.get("train_seconds") is not None \
        else time.perf_counter() - start
    return cli, float(seconds)


def config_fingerprint(args: list) -> str | None:
    """The fingerprint of every file a cell's ``fit`` line names: its ``--config``, any argument whose value is a
    file (``--model.init_weights FILE``, ``--set model.init_weights=FILE``, a file inside an override's nested value),
    and every file named by a string anywhere inside the config (``model.init_weights: FILE``, a data file, a
    tokenizer; a config file named there is read in turn), each by its bytes: a cell trained from a file since
    replaced is trained again, not reused because its path is the same. A line whose only file is its config keeps
    that file's fingerprint alone."""
    args = [str(a) for a in args]
    config = args[args.index("--config") + 1] if "--config" in args[:-1] else None
    named = [a.split("=", 1)[1] if a.startswith("--") and "=" in a else a for a in args]
    values = [v for v in named if not v.startswith("--")]
    found = {name: file for v in values for name, file in _files_in(_value(v), Path.cwd())}
    if config and Path(config).is_file():
        found.update(_files_named_by(Path(config), {Path(config).resolve()}))
    found.pop(config, None)
    first = runner.fingerprint(config) if config and Path(config).is_file() else None
    if not found:
        return first
    return ";".join([first or "", *(f"{v}={runner.fingerprint(found[v])}" for v in sorted(found))])


def _value(text: str):
    """A fit argument's value as the fit reads it: a nested mapping or list (an override ``str``-ed into the line)
    parsed, anything else as written."""
    if text[:1] in "{[":
        import yaml

        try:
            return yaml.safe_load(text)
        except yaml.YAMLError:
            pass
    return text


def _files_in(node, *bases: Path) -> list[tuple[str, Path]]:
    """(the string as written, the file) for every string in ``node`` (mappings and lists walked) that names an
    existing file, relative paths resolved against each of ``bases`` in turn (where the fit runs, then the config's
    own folder, as jsonargparse resolves a config named inside a config)."""
    if isinstance(node, dict):
        return [found for value in node.values() for found in _files_in(value, *bases)]
    if isinstance(node, (list, tuple)):
        return [found for value in node for found in _files_in(value, *bases)]
    if not isinstance(node, str) or not node.strip() or "\n" in node:
        return []
    path = Path(os.path.expanduser(node))
    for base in bases:
        try:
            candidate = path if path.is_absolute() else base / path
            if candidate.is_file():
                return [(node, candidate)]
        except (OSError, ValueError):  # not a name the file system takes (too long, a NUL)
            return []
    return []


def _files_named_by(config: Path, seen: set) -> dict[str, Path]:
    """Every file a YAML config names (``_files_in``), and those named by the YAML configs it names, each read
    once; a config that does not parse names nothing here (the fit refuses it in its own sentence)."""
    try:
        data = load_yaml(config)
    except (OSError, ValueError):
        return {}
    found = dict(_files_in(data, Path.cwd(), config.parent))
    for file in list(found.values()):
        if file.suffix in (".yaml", ".yml") and file.resolve() not in seen:
            seen.add(file.resolve())
            found.update(_files_named_by(file, seen))
    return found


def preset_commit(config_file: str, preset: str) -> str:
    """Where a pre-registered preset was fixed: the first commit of this checkout that wrote its name into
    ``config_file`` (``git log -S``), so a reader can check it came before the run's cells."""
    import subprocess

    from ..utils.checkout import checkout_root

    root, found = checkout_root(), None
    if root is not None:
        try:
            found = subprocess.run(["git", "log", "--reverse", "--format=%h %ad", "--date=iso", "-S",
                                    f"  {preset}:", "--", config_file], cwd=root, capture_output=True, text=True,
                                   timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            found = None
    first = found.stdout.splitlines()[0] if found is not None and found.returncode == 0 and found.stdout else ""
    if not first:
        return "its commit cannot be shown (not a git checkout, or the preset is not committed yet)"
    commit, _, when = first.partition(" ")
    return f"the preset was first committed in {commit} ({when})"
