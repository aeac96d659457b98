"""``cli.py study reach``: can each mask carry a key to its query beyond SWA's receptive field, layer over layer?

A control stands against SA only if its mask reaches what the task asks. Each cell (variant, depth, window, draw
seed) stacks ``depth`` layers of the variant's own causal mask (a deterministic control's pattern tuned for that
depth, as a model of ``depth`` layers runs it: ``AttentionSpec.depth``) over a row of ``n`` tokens and measures, for
every key-query distance d past SWA's field L·(w−1), the chance that the last query reaches the key d back
(``analysis.mechanism.reach_by_distance``, over ``trials`` draws of every layer from that seed): the cell's items. A
draw seed stands for a trained model's seed, which fixes its draws; fixed patterns draw nothing, so theirs agree.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from itertools import product

from ..attention import AttentionSpec, get_variant, variant_label, variant_names
from ..attention.variants import FULL, SWA
from ..utils import trained
from .base import Experiment, Flag, Report, main as run_experiment

OUTCOME = trained.Outcome("reach", "reach beyond L·(w−1)", scale=100, spec=".1f", unit="points")
SETTING = ["L", "w", "n"]


@dataclass
class ReachConfig:
    """``configs/study/reach.yaml``. variants, depths, windows, seeds: the grid; n: the row's tokens; trials: draws
    of every layer per seed; comparisons: ``{a, b}`` each, paired by seed; out: the output folder."""

    variants: list[str]
    depths: list[int]
    windows: list[int]
    seeds: list[int]
    n: int = 256
    trials: int = 16
    comparisons: list[dict] = field(default_factory=list)
    jobs: int | str | None = 1
    out: str = "outputs/study/reach"


class Reach(Experiment):
    name = "study reach"
    config = ReachConfig
    config_file = "configs/study/reach.yaml"
    presets_note = "quick: seconds; tuned-n256, tuned-n512: Table 16d, the controls tuned for the depth"
    folders = "outputs/study/reach, reach_quick, reach_tuned_n256, reach_tuned_n512"
    flags = (Flag("variants", "override the config's variants"), Flag("depths", "override the depths", int),
             Flag("windows", "override the windows", int), Flag("seeds", "override the draw seeds", int))
    required = ("variants", "depths", "windows", "seeds")
    needs = "reach"

    def check(self, cfg, given):
        """Each variant, comparison and window (a control's least is 3), then ``check_reach_grid``."""
        from ..analysis.mechanism import check_reach_grid

        for name in [*cfg.variants, *(c[k] for c in cfg.comparisons for k in ("a", "b"))]:
            get_variant(name)
        for name, w in product(cfg.variants, cfg.windows):
            AttentionSpec(name, window=w)  # windows >= 1; a control's >= 3
        draws = sum((cfg.trials if get_variant(v).draws else 1) * d
                    for _, v, d, _ in product(cfg.seeds, cfg.variants, cfg.depths, cfg.windows))
        check_reach_grid(cfg.n, cfg.trials, cfg.depths, cfg.windows, draws)

    def cells(self, cfg):
        return [dict(variant=v, depth=d, window=w, seed=s, n=cfg.n)
                for s, v, d, w in product(cfg.seeds, cfg.variants, cfg.depths, cfg.windows)]

    def cell_id(self, cell):
        return f"{cell['variant']}_L{cell['depth']}_w{cell['window']}_n{cell['n']}_s{cell['seed']}"

    def spec(self, cell, cfg, out):
        revision = get_variant(cell["variant"]).revision  # a variant whose pattern changed measures again
        return {**cell, "trials": cfg.trials, **({"revision": revision} if revision > 1 else {})}

    def run(self, cell, spec):
        from ..analysis.mechanism import reach_by_distance

        far = cell["depth"] * (cell["window"] - 1) + 1
        chance = reach_by_distance(cell["variant"], cell["n"], cell["window"], cell["depth"], trials=spec["trials"],
                                   seed=cell["seed"])
        return {**cell, "reach": [round(float(x), 6) for x in chance[far:]]}

    def line(self, record):
        return f"reach beyond L·(w−1) {100 * sum(record['reach']) / max(1, len(record['reach'])):.1f}%"

    def report(self, cfg, records, out):
        units: dict[tuple, dict] = {}
        for r in records:  # {(L, w, n): {variant: {draw seed: reach at each far distance}}}
            units.setdefault((r["depth"], r["window"], r["n"]), {}).setdefault(r["variant"], {})[r["seed"]] = r["reach"]
        pairs = [(c["a"], c["b"]) for c in cfg.comparisons]
        section = trained.report(units, OUTCOME, pairs, control=(FULL.name, SWA.name), order=variant_names())
        lines = trained.markdown(section, SETTING, label=variant_label)
        table = "\n".join(trained.summary_table(section.summaries, OUTCOME, SETTING, label=variant_label)) + "\n"
        note = ("Here a seed is a draw seed (the draws a trained model's seed fixes), and each item one key–query "
                "distance past L·(w−1). " + trained.NOTE)
        rows = [{"L": r["setting"][0], "w": r["setting"][1], "n": r["setting"][2], "variant": r["arm"],
                 "reach": r["mean"], "lo": r.get("lo"), "hi": r.get("hi"), "seeds": r["seeds"]}
                for r in section.summaries]
        style = lambda v: (get_variant(v).color, get_variant(v).marker, variant_label(v))  # noqa: E731
        return Report(table=table, compare="\n".join([*lines[1:], "", note]) + "\n",
                      comparisons=section.comparisons, rows=rows,
                      figures={"reach.png": lambda path: trained.figure(trained.panels(
                          section, lambda s: f"L={s[0]}, w={s[1]}, n={s[2]}"), path, style,
                          "a seed here: a draw seed of every layer's mask")})


EXPERIMENT = Reach()


def main(argv: list[str] | None = None) -> list[dict]:
    return run_experiment(EXPERIMENT, argv)
