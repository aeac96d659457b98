"""Trained comparisons: what every study that trains models reports, for any outcome it scores.

A study hands over its scored cells as **units**: for one setting (task, depth, window, ...), each arm's (a
variant's, a model's) items per training seed, ``{arm: {seed: [item, ...]}}``, where seed s of two arms shares its
initialisation and data order and scored the same items in the same order. From them, one place makes

- ``summary``: each arm's mean over its training seeds with a t interval over the seeds (a range under five),
  each seed's own score, the seed SD, and the share of seeds past a threshold (the seeds that learned);
- ``comparisons``: A − B paired by training seed (``utils.stats.seed_comparison``), with the verdict worded from the
  interval, "equivalent within ±δ" from two one-sided tests at a margin, and the positive control's headroom;
- ``power``: from a pilot's SD of the per-seed differences, the smallest difference a design of n seeds detects
  with 80% power at the 5% level (a paired t test), and the seeds a given difference needs;
- ``markdown`` tables and ``figure`` (each seed a dot, the mean with its interval; a range dashed).

Every interval comes from ``utils.stats``; nothing here knows what a variant is (the study passes its styles).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from .atomic import savefig
from .report import head, pyplot, row
from .stats import MIN_UNITS, Interval, headroom, seed_comparison, t_interval

Units = dict[str, dict[int, list[float]]]  # {arm: {training seed: items}}


@dataclass(frozen=True)
class Outcome:
    """One scored outcome: its key in the cells, its name in tables, its direction, and how it prints
    (``scale`` times the value, with ``spec``: accuracy as points, ``scale`` 100)."""

    key: str
    name: str
    lower_is_better: bool = False
    scale: float = 1.0
    spec: str = ".1f"
    unit: str = ""

    def text(self, value: float | None, signed: bool = False) -> str:
        if value is None or value != value:
            return "–"
        return f"{self.scale * value:{'+' if signed else ''}{self.spec}}"

    def interval(self, ci: Interval, signed: bool = False) -> str:
        return ci.map(lambda x: self.scale * x).text(("+" if signed else "") + self.spec)


def seed_means(items_by_seed: dict[int, list[float]]) -> dict[int, float]:
    return {s: float(np.mean(v)) for s, v in sorted(items_by_seed.items()) if len(v)}


def summary(units: Units, outcome: Outcome, threshold: float | None = None) -> list[dict]:
    """One row per arm: mean over its training seeds with a t interval (a range under five), per seed, seed SD,
    and with ``threshold`` the share of seeds whose score reaches it (beyond it, for a lower-is-better outcome)."""
    out = []
    for arm, by_seed in units.items():
        means = seed_means(by_seed)
        if not means:
            continue
        values = list(means.values())
        ci = t_interval(values, items=sum(len(v) for v in by_seed.values()), seeds=len(values), scheme="seeds")
        entry = {"arm": arm, "outcome": outcome.key, **ci.as_dict(), "per_seed": means,
                 "seed_sd": float(np.std(values, ddof=1)) if len(values) > 1 else None}
        if threshold is not None:
            reached = [v <= threshold if outcome.lower_is_better else v >= threshold for v in values]
            entry["reached"] = sum(reached)
        out.append(entry)
    return out


def comparisons(units: Units, pairs: list[tuple[str, str]], outcome: Outcome, margin: float | None = None,
                control: tuple[str, str] | None = None, **fields) -> list[dict]:
    """A − B for each (a, b) whose arms both trained some seed, paired seed by seed. ``control`` (full attention,
    SWA): the positive control, whose difference over every seed it trained (the references may have fewer seeds
    than the comparisons) gives each other row its headroom: None under five seeds, as every range."""
    room = None  # over every seed the control trained: the setting's own headroom, the same for every row
    ctrl_seeds = sorted(set(units.get(control[0], {})) & set(units.get(control[1], {}))) if control else []
    if ctrl_seeds:
        ctrl = seed_comparison({s: _same_items(units[control[0]][s], units[control[1]][s]) for s in ctrl_seeds},
                               outcome.lower_is_better)
        room = headroom(Interval.from_dict(ctrl), outcome.lower_is_better)
    out = []
    for a, b in pairs:
        seeds = sorted(set(units.get(a, {})) & set(units.get(b, {})))
        if not seeds:
            continue
        paired = {s: _same_items(units[a][s], units[b][s]) for s in seeds}
        out.append(seed_comparison(paired, outcome.lower_is_better, margin, a=a, b=b, outcome=outcome.key,
                                   headroom=None if (a, b) == control else room, **fields))
    return out


def _same_items(a: list[float], b: list[float]) -> tuple[list[float], list[float]]:
    if len(a) != len(b):
        raise ValueError(f"two arms of one training seed scored {len(a)} and {len(b)} items; a paired comparison "
                         "needs the same items in the same order.")
    return a, b


def power(seed_sd: float, seeds: int, level: float = 0.95, target: float = 0.8) -> float:
    """The smallest true A − B a paired t test over ``seeds`` training seeds detects with probability ``target``
    at ``1 - level`` two-sided, when per-seed differences have SD ``seed_sd`` (the usual approximation
    (t_{1-α/2} + t_{power}) · SD / √n with n − 1 degrees of freedom)."""
    from scipy import stats as st

    if seeds < 2:
        return math.inf
    df = seeds - 1
    return float((st.t.ppf(1 - (1 - level) / 2, df) + st.t.ppf(target, df)) * seed_sd / math.sqrt(seeds))


def power_text(seed_sd: float, seeds: int, outcome: "Outcome", margin: float | None = None,
               planned: tuple[int, ...] = (10, 20)) -> str:
    """The power of a design in words, from a seed SD: what ``seeds`` detect (none under ``MIN_UNITS``, where
    there is no test), what the ``planned`` counts would, and with a margin the seeds it needs."""
    own = (f"with its {seeds} seeds no test is possible (fewer than {MIN_UNITS})" if seeds < MIN_UNITS else
           f"its {seeds} seeds detect {outcome.text(power(seed_sd, seeds))} {outcome.unit}")
    more = ", ".join(f"{n} seeds {outcome.text(power(seed_sd, n))}" for n in planned if n != seeds)
    need = "" if margin is None else f"; {outcome.text(margin)} {outcome.unit} needs " + (
        f"{seeds_needed(seed_sd, margin)} seeds" if seeds_needed(seed_sd, margin) else "more than 1000 seeds")
    return f"seed SD {outcome.text(seed_sd)}: {own}" + (f" ({more})" if more else "") + need


def seeds_needed(seed_sd: float, delta: float, most: int = 1000) -> int | None:
    """The fewest training seeds whose design detects a true difference ``delta`` with 80% power (``power``)."""
    return next((n for n in range(max(2, MIN_UNITS), most + 1) if power(seed_sd, n) <= abs(delta)), None)


# ---- tables and the figure ------------------------------------------------------------------------
def summary_table(rows_: list[dict], outcome: Outcome, settings: list[str], threshold_label: str | None = None,
                  label: Callable[[str], str] = str) -> list[str]:
    """Markdown lines: one row per (setting, arm); ``rows_`` carry ``setting`` (a tuple, as ``settings`` names)."""
    names = [*settings, "arm", "seeds", f"{outcome.name} [95%]", "per seed", "seed SD",
             *([threshold_label] if threshold_label else [])]
    lines = head(names, ["---"] * (len(settings) + 1) + ["---:", "---:", "---", "---:"] +
                 (["---:"] if threshold_label else []))
    for r in rows_:
        ci = Interval.from_dict(r)
        lines.append(row([*r["setting"], label(r["arm"]), r["seeds"], _with_form(outcome, ci),
                          ", ".join(outcome.text(v) for v in r["per_seed"].values()), outcome.text(r["seed_sd"]),
                          *([f"{r['reached']}/{r['seeds']}"] if threshold_label else [])]))
    return lines


def comparison_table(rows_: list[dict], outcome: Outcome, settings: list[str], label: Callable[[str], str] = str) \
        -> list[str]:
    """Markdown lines: one row per comparison (``comparisons``' rows, each with its ``setting`` tuple)."""
    lines = head([*settings, "A", "B", "seeds", f"A − B ({outcome.name}) [95%]", "per seed", "seed SD", "verdict",
                  "headroom"], ["---"] * (len(settings) + 2) + ["---:", "---:", "---", "---:", "---", "---"])
    for r in rows_:
        ci = Interval.from_dict(r)
        room = r.get("headroom")
        lines.append(row([*r["setting"], label(r["a"]), label(r["b"]), r["seeds"], _with_form(outcome, ci, signed=True),
                          ", ".join(outcome.text(v, signed=True) for v in r["per_seed"].values()),
                          outcome.text(r.get("seed_sd")), r["verdict"],
                          "–" if room is None else ("yes" if room else "no")]))
    return lines


def _with_form(outcome: Outcome, ci: Interval, signed: bool = False) -> str:
    text = outcome.interval(ci, signed)
    return text if ci.form != "range" else f"{outcome.text(ci.mean, signed)}, {ci.seeds} seeds: range " \
        f"[{outcome.text(ci.lo, signed)}, {outcome.text(ci.hi, signed)}]"


NOTE = ("Each training seed is one unit: its score is the mean over its items, and A − B pairs A's and B's models "
        "of one seed (one initialisation and data order, the same validation items). 95% interval: a t interval "
        f"over the seeds; with fewer than {MIN_UNITS} seeds only their range, and no verdict. \"Equivalent within "
        "±δ\" only from two one-sided tests (the 90% interval inside ±δ). Headroom: whether full attention beats "
        "SWA over the seeds both trained (the positive control of the setting); a row without it cannot rank "
        "long-range variants.")


def figure(panels: list[tuple[str, list[dict], Outcome]], path: Path, style: Callable[[str], tuple[str, str, str]],
           title: str = "") -> None:
    """One panel per (title, summary rows, outcome): per arm each seed's score (hollow dots, spread sideways so
    that none hides another) and the mean with its 95% interval over the seeds (a dashed bar: a range)."""
    plt = pyplot()
    fig, axes = plt.subplots(1, len(panels), figsize=(max(4.4, 0.55 * max(len(p[1]) for p in panels) + 1.5)
                                                      * len(panels), 4.0), squeeze=False)
    for ax, (name, rows_, outcome) in zip(axes[0], panels):
        for i, r in enumerate(rows_):
            color, marker, label = style(r["arm"])
            mean, lo, hi = (outcome.scale * (math.nan if r.get(k) is None else r[k]) for k in ("mean", "lo", "hi"))
            bars = ax.errorbar([i], [mean], yerr=[[mean - lo], [hi - mean]] if lo == lo else None, marker=marker,
                               color=color, capsize=3, markersize=6, zorder=3)
            if r.get("form") == "range":
                for line in bars[2]:
                    line.set_linestyle("--")
            seeds = [outcome.scale * v for v in r["per_seed"].values()]
            offsets = np.linspace(-0.25, 0.25, len(seeds)) if len(seeds) > 1 else [0.0]
            ax.scatter([i + 0.3 + o * 0.6 for o in offsets], seeds, s=12, facecolors="none", edgecolors=color,
                       linewidths=0.8, alpha=0.85, zorder=2)
        ax.set_xticks(range(len(rows_)), [style(r["arm"])[2] for r in rows_], rotation=40, ha="right", fontsize=7)
        ax.set_title(name, fontsize=9)
        ax.set_ylabel(f"{outcome.name}{f' ({outcome.unit})' if outcome.unit else ''}", fontsize=8)
        ax.grid(alpha=0.3, axis="y")
    fig.suptitle((title + "\n" if title else "") + f"bar: 95% t interval over training seeds (dashed: their range, "
                 f"under {MIN_UNITS} seeds); dots: each seed", fontsize=8)
    fig.tight_layout()
    savefig(fig, path, dpi=150, bbox_inches="tight")
    plt.close(fig)
