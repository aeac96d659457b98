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
- ``within_seed``: A − B on the items of one training seed's two models (a paired bootstrap over the items): what
  one trained model shows alone, with the seed's own positive control;
- ``report``: all of it for one outcome over the settings of a run (a ``Section``), and its views: ``markdown``
  (one row per setting and arm, one per comparison, the power), ``wide_table`` (the paper's layout: an arm a row,
  an outcome a column), ``panels`` and ``figure`` (each seed a dot, the mean with its interval; a range dashed),
  and ``profile`` (a score along an axis, each arm's mean over its seeds with its interval, side by side).

``items`` in a summary or comparison row counts the items over all its seeds (a seed's items times its seeds).

A study supplies its cells' items as units and its arms' names and styles; the tables, verdicts and figures are
made here. Every interval comes from ``utils.stats``; nothing here knows what a variant is.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

import numpy as np

from .report import Column, ab_table, fmt, head, pyplot, row, save_figure, spread
from .stats import FEW_SEEDS, MIN_UNITS, Interval, above_floor, cannot_decide, derived_seed, equivalent, headroom, \
    headroom_label, paired_difference, seed_comparison, t_interval

Units = dict[str, dict[int, list[float]]]  # {arm: {training seed: items}}


@dataclass(frozen=True)
class Outcome:
    """One scored outcome: its key in the cells, its name in tables, its direction, and how it prints
    (``scale`` times the value, with ``spec``: accuracy as points, ``scale`` 100).

    A level (an arm's mean) may be shown through ``transform`` (the mean NLL per token as a perplexity:
    ``math.exp``); a difference (``signed``) never is: it stays in the items' unit, named ``diff_name`` and printed
    with ``diff_spec`` where those are given."""

    key: str
    name: str
    lower_is_better: bool = False
    scale: float = 1.0
    spec: str = ".1f"
    unit: str = ""
    transform: Callable[[float], float] | None = None
    diff_name: str | None = None
    diff_spec: str | None = None

    def value(self, x: float, signed: bool = False) -> float:
        """What a level or a difference prints as (before its format)."""
        return self.scale * (self.transform(x) if self.transform and not signed else x)

    def _spec(self, signed: bool) -> str:
        return ("+" + (self.diff_spec or self.spec)) if signed else self.spec

    def text(self, value: float | None, signed: bool = False) -> str:
        if value is None or value != value:
            return "–"
        return fmt(self.value(value, signed), self._spec(signed))

    def interval(self, ci: Interval, signed: bool = False) -> str:
        return ci.map(lambda x: self.value(x, signed)).text(self._spec(signed))

    @property
    def difference(self) -> str:
        return self.diff_name or self.name


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
                control: tuple[str, str] | Callable[[str, str], tuple[str, str] | None] | None = None,
                **fields) -> list[dict]:
    """A − B for each (a, b) whose arms both trained some seed, paired seed by seed. ``control`` (full attention,
    SWA; or a function of (a, b) naming the pair that is the row's own, SWA at B's window say): the positive
    control, whose difference over every seed it trained (the references may have fewer seeds than the comparisons)
    gives each other row its headroom: None under five seeds, as every range. Each control is computed once."""
    rooms: dict[tuple[str, str], bool | None] = {}

    def room(ctrl: tuple[str, str]) -> bool | None:
        """Over every seed the control trained: the setting's own headroom, the same for every row it serves."""
        if ctrl not in rooms:
            seeds = sorted(set(units.get(ctrl[0], {})) & set(units.get(ctrl[1], {})))
            rooms[ctrl] = headroom(Interval.from_dict(seed_comparison(
                {s: _same_items(units[ctrl[0]][s], units[ctrl[1]][s]) for s in seeds}, outcome.lower_is_better)),
                outcome.lower_is_better) if seeds else None
        return rooms[ctrl]

    out = []
    for a, b in pairs:
        seeds = sorted(set(units.get(a, {})) & set(units.get(b, {})))
        if not seeds:
            continue
        ctrl = control(a, b) if callable(control) else control
        paired = {s: _same_items(units[a][s], units[b][s]) for s in seeds}
        row = seed_comparison(paired, outcome.lower_is_better, margin, a=a, b=b, outcome=outcome.key,
                              headroom=None if ctrl is None or (a, b) == tuple(ctrl) else room(tuple(ctrl)), **fields)
        if margin is not None and row["verdict"] == equivalent(margin):
            shown = f"{outcome.text(margin, signed=True).lstrip('+')} {outcome.unit}"  # as the table prints values
            floor = None if ctrl is None else ctrl[1]
            row["floor"] = {arm: floor_gain(units, arm, floor, outcome) for arm in (a, b)}
            clear = all(above_floor(Interval.from_dict(g) if g else None, margin, outcome.lower_is_better)
                        for g in row["floor"].values())
            # no floor trained with the arms' seeds: the verdict names it, not the arms
            missing = floor is None or any(not set(units.get(arm, {})) & set(units.get(floor, {}))
                                           for arm in (a, b) if arm != floor)
            row["verdict"] = equivalent(shown) if clear else cannot_decide(shown, (floor or "") if missing else None)
        out.append(row)
    return out


def floor_gain(units: Units, arm: str, floor: str | None, outcome: Outcome) -> dict | None:
    """arm − floor (SWA) over the seeds both trained, as an interval's dict; None where the floor was not trained
    (the floor rule then cannot be met: "equivalent" needs both arms to beat it by more than the margin)."""
    seeds = sorted(set(units.get(arm, {})) & set(units.get(floor, {}))) if floor else []
    if not seeds or arm == floor:
        return None
    return seed_comparison({s: _same_items(units[arm][s], units[floor][s]) for s in seeds},
                           outcome.lower_is_better)


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
                          ", ".join(outcome.text(v) for v in r["per_seed"].values()), shown_sd(r, outcome),
                          *([f"{r['reached']}/{r['seeds']}"] if threshold_label else [])]))
    return lines


def seed_sd(entry: dict, outcome: Outcome) -> float | None:
    """The SD over training seeds of an arm's score as it prints (a perplexity's, not its NLL's, when the outcome
    is shown through a transform); None with one seed."""
    values = [outcome.value(v) for v in entry["per_seed"].values()]
    return float(np.std(values, ddof=1)) if len(values) > 1 else None


def shown_sd(entry: dict, outcome: Outcome) -> str:
    """``seed_sd`` in the outcome's format; "–" with one seed."""
    sd = seed_sd(entry, outcome)
    return "–" if sd is None else f"{sd:{outcome.spec}}"


def comparison_table(rows_: list[dict], outcome: Outcome, settings: list[str], label: Callable[[str], str] = str) \
        -> list[str]:
    """Markdown lines: one row per comparison (``comparisons``' rows, each with its ``setting`` tuple)."""
    return ab_table(rows_, [*_setting_columns(settings), Column("A", lambda r: label(r["a"])),
                            Column("B", lambda r: label(r["b"])), Column("seeds", lambda r: r["seeds"], "---:"),
                            Column(f"A − B ({outcome.difference}) [95%]",
                                   lambda r: _with_form(outcome, Interval.from_dict(r), signed=True), "---:"),
                            Column("per seed", lambda r: ", ".join(outcome.text(v, signed=True)
                                                                   for v in r["per_seed"].values())),
                            Column("seed SD", lambda r: outcome.text(r.get("seed_sd"), signed=True).lstrip("+"),
                                   "---:"),
                            Column("verdict", lambda r: verdict_text(r, outcome)),
                            Column("headroom", lambda r: "–" if r.get("headroom") is None else
                                   ("yes" if r["headroom"] else "no"))])


def _setting_columns(settings: list[str]) -> list[Column]:
    return [Column(name, lambda r, i=i: r["setting"][i]) for i, name in enumerate(settings)]


def verdict_text(r: dict, outcome: Outcome | None = None) -> str:
    """A comparison row's verdict as the tables print it: with the sign-flip test's p where it decided too, and
    beside an "equivalent" its 90% interval and how much it rests on single seeds (``stats.fragility``)."""
    flip, said = r.get("sign_flip"), r["verdict"]
    if flip:
        said += f" (spreads differ: t and sign-flip at {flip['level']:.0%}, sign-flip p = {flip['p']:.3g})"
    fragility = r.get("fragility")
    if outcome is None or not fragility or not r["verdict"].startswith("equivalent"):
        return said  # better and worse keep their fragility in compare.json
    def text(v):
        return outcome.text(v, signed=True)
    if r.get("lo90") is not None:
        said += f"; 90% [{text(r['lo90'])}, {text(r['hi90'])}]"
    k = fragility.get("fewest")
    said += ("; no removal of seeds that leaves five undoes it" if k is None else
             f"; removing {'at most ' if not fragility.get('exact', True) else ''}{k} seed{'s' if k > 1 else ''} "
             f"undoes it")
    if fragility.get("loo_mean"):
        lo, hi = fragility["loo_mean"]
        said += f"; leaving one seed out, the mean runs {text(lo)} to {text(hi)}"
    return said


def _with_form(outcome: Outcome, ci: Interval, signed: bool = False) -> str:
    text = outcome.interval(ci, signed)
    return text if ci.form != "range" else f"{outcome.text(ci.mean, signed)}, {ci.seeds} seeds: range " \
        f"[{outcome.text(ci.lo, signed)}, {outcome.text(ci.hi, signed)}]"


NOTE = ("Each training seed is one unit: its score is the mean over its items, and A − B pairs A's and B's models "
        "of one seed (one initialisation and data order, the same validation items). 95% interval: a t interval "
        f"over the seeds; with fewer than {MIN_UNITS} seeds only their range, and no verdict. Better or worse needs "
        f"the t interval at 99% under {FEW_SEEDS} seeds, and wherever the arms' seed SDs differ more than twofold "
        "(one tight, the other's seeds learning now and then); there, where one seed can move the verdict, a paired "
        "sign-flip test over the seeds must agree at 99% too (under 8 seeds nothing is decided then). \"Equivalent "
        f"within ±δ\" only from {FEW_SEEDS} seeds, from two one-sided tests (the 90% interval inside ±δ, printed "
        "beside it with the fewest seeds whose removal undoes it), and only where both arms beat SWA by more than δ "
        "(their whole 95% interval past it); otherwise \"cannot decide\": arms that learn nothing are equal by "
        "construction. Headroom: whether full attention beats "
        "SWA over the seeds both trained (the positive control of the setting); a row without it cannot rank "
        "long-range variants.")


def margins_line(margins: dict | None, preregistered: str | None) -> str:
    """What the report says of its margins: each δ, and whether it was fixed before the run (``preregistered``:
    when and from what) or not, in which case an equivalence it supports was chosen knowing the result."""
    if not margins:
        return ""
    shown = ", ".join(f"{k} ±{v:g}" for k, v in margins.items())
    if preregistered:
        return f" Margins δ ({shown}), fixed before the run: {preregistered}."
    return (f" Margins δ ({shown}), not fixed before this run's cells: an \"equivalent\" here rests on a margin set "
            "knowing earlier results of the same cells, not a pre-registered one.")


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
            mean, lo, hi = (math.nan if r.get(k) is None else outcome.value(r[k]) for k in ("mean", "lo", "hi"))
            bars = ax.errorbar([i], [mean], yerr=[[mean - lo], [hi - mean]] if lo == lo else None, marker=marker,
                               color=color, capsize=3, markersize=6, zorder=3)
            if r.get("form") == "range":
                for line in bars[2]:
                    line.set_linestyle("--")
            seeds = [outcome.value(v) for v in r["per_seed"].values()]
            offsets = np.linspace(-0.25, 0.25, len(seeds)) if len(seeds) > 1 else [0.0]
            ax.scatter([i + 0.3 + o * 0.6 for o in offsets], seeds, s=12, facecolors="none", edgecolors=color,
                       linewidths=0.8, alpha=0.85, zorder=2)
        ax.set_xticks(range(len(rows_)), [style(r["arm"])[2] for r in rows_], rotation=40, ha="right", fontsize=7)
        ax.set_title(name, fontsize=9)
        unit = "" if outcome.transform else outcome.unit  # the unit of the items, not of their transform
        ax.set_ylabel(f"{outcome.name}{f' ({unit})' if unit else ''}", fontsize=8)
        ax.grid(alpha=0.3, axis="y")
    fig.suptitle((title + "\n" if title else "") + f"bar: 95% t interval over training seeds (dashed: their range, "
                 f"under {MIN_UNITS} seeds); dots: each seed", fontsize=8)
    fig.tight_layout()
    save_figure(fig, path, dpi=150, bbox_inches="tight")


# ---- one trained model alone ----------------------------------------------------------------------
def within_seed(units: Units, pairs: list[tuple[str, str]], outcome: Outcome, control: tuple[str, str] | None = None,
                key: tuple = ()) -> list[dict]:
    """A − B on the items of each training seed both arms trained: a paired percentile bootstrap over those items
    (``utils.stats``' items scheme). It holds the items' noise, not the training seed's, so it says what one pair of
    trained models shows and never decides for the arms. ``control`` (full attention, SWA) gives each row its own
    seed's headroom. ``key`` (the setting) makes each bootstrap's seed its own."""
    rooms: dict[int, bool | None] = {}

    def room(seed: int) -> bool | None:
        if seed not in rooms:
            a, b = (units.get(arm, {}).get(seed) for arm in control)
            rooms[seed] = None if a is None or b is None or len(a) != len(b) else headroom(
                paired_difference(a, b, seed=derived_seed(0, *key, seed, *control)), outcome.lower_is_better)
        return rooms[seed]

    out = []
    for a, b in pairs:
        for seed in sorted(set(units.get(a, {})) & set(units.get(b, {}))):
            xa, xb = _same_items(units[a][seed], units[b][seed])
            diff = paired_difference(xa, xb, seed=derived_seed(0, *key, seed, a, b))
            out.append({"a": a, "b": b, "seed": seed, "outcome": outcome.key, "mean_a": float(np.mean(xa)),
                        "mean_b": float(np.mean(xb)), **diff.as_dict(),
                        "verdict": diff.verdict(outcome.lower_is_better),
                        "headroom": None if control is None or (a, b) == tuple(control) else room(seed)})
    return out


def within_seed_table(rows_: list[dict], outcome: Outcome, settings: list[str], label: Callable[[str], str] = str) \
        -> list[str]:
    """Markdown lines: one row per (setting, seed, comparison) of ``within_seed``."""
    return ab_table(rows_, [*_setting_columns(settings), Column("seed", lambda r: r["seed"]),
                            Column("A", lambda r: label(r["a"])), Column("B", lambda r: label(r["b"])),
                            Column(f"A: {outcome.name}", lambda r: outcome.text(r["mean_a"]), "---:"),
                            Column("B", lambda r: outcome.text(r["mean_b"]), "---:"),
                            Column(f"A − B ({outcome.difference}) [95%]",
                                   lambda r: outcome.interval(Interval.from_dict(r), signed=True), "---:"),
                            Column("verdict", lambda r: r["verdict"]),
                            Column("headroom", lambda r: headroom_label(r["headroom"])),
                            Column("items", lambda r: r["items"], "---:")])


WITHIN_NOTE = ("Each trained model alone: A − B on the same items of one training seed's two models, a paired "
               "percentile bootstrap over the items (2000 resamples). It holds the items' noise, not the training "
               "seed's, so it describes this pair of models and decides nothing about the variants (that is the "
               "table over training seeds). Headroom here: the seed's own positive control (full attention − SWA "
               "on the same items).")


# ---- a run's report, one outcome at a time ---------------------------------------------------------
@dataclass
class Section:
    """One outcome over a run's settings: each arm's summary and each comparison over training seeds, each row with
    its ``setting`` tuple."""

    outcome: Outcome
    summaries: list[dict]
    comparisons: list[dict]


def report(by_setting: dict[tuple, Units], outcome: Outcome, pairs: list[tuple[str, str]], *,
           margin: float | None = None, control=None, threshold: float | None = None,
           order: list[str] | None = None) -> Section:
    """``summary`` and ``comparisons`` of every setting (``{setting: units}``); arms in ``order`` (a registry's
    order) where given, else as they come; ``control`` as ``comparisons`` takes it."""
    summaries, compared = [], []
    for setting, units in sorted(by_setting.items()):
        arms = {a: units[a] for a in order if a in units} if order else units
        summaries += [{**e, "setting": setting} for e in summary(arms, outcome, threshold)]
        compared += [{**e, "setting": setting} for e in comparisons(arms, pairs, outcome, margin, control)]
    return Section(outcome, summaries, compared)


def markdown(section: Section, settings: list[str], *, label: Callable[[str], str] = str,
             threshold_label: str | None = None, margin: float | None = None, note: str | None = None) -> list[str]:
    """A section as markdown: its heading, one row per (setting, arm) (and the study's ``note`` on them), one per
    comparison, and the power of the design from each comparison's own seed SD. Empty where nothing was
    summarised."""
    out = section.outcome
    if not section.summaries:
        return []
    lines = ["", f"## Over training seeds: {out.name}", "",
             *summary_table(section.summaries, out, settings, threshold_label, label), *(["", note] if note else [])]
    if section.comparisons:
        lines += ["", *comparison_table(section.comparisons, out, settings, label)]
        powered = [r for r in section.comparisons if r.get("seed_sd")]
        if powered:
            lines += ["", "Power (a paired t test over training seeds, 5% level, 80% power: the smallest true A − B "
                      "it detects), from each row's own seed SD: "
                      + "; ".join(f"{label(r['a'])} − {label(r['b'])}: "
                                  + power_text(r["seed_sd"], r["seeds"], _diff(out), margin) for r in powered) + "."]
    return lines


def _diff(outcome: Outcome) -> Outcome:
    """The outcome as its differences print (for ``power_text``, whose numbers are differences)."""
    return replace(outcome, name=outcome.difference, spec=outcome.diff_spec or outcome.spec, transform=None)


def wide_table(sections: list[Section], arms: list[str], *, label: Callable[[str], str] = str,
               extra: dict[str, Callable[[str], object]] | None = None) -> list[str]:
    """The paper's layout for one setting: an arm a row, an outcome a column (mean [95%], or its range under five
    seeds), then the seeds and any ``extra`` columns (name -> value of an arm)."""
    extra = extra or {}
    by = {(s.outcome.key, r["arm"]): r for s in sections for r in s.summaries}
    lines = head(["Model", *(s.outcome.name for s in sections), "Seeds", *extra],
                 ["---"] * (1 + len(sections)) + ["---:"] * (1 + len(extra)))
    for arm in arms:
        entries = [by.get((s.outcome.key, arm)) for s in sections]
        if not any(entries):
            continue
        seeds = max((e["seeds"] for e in entries if e), default=0)
        lines.append(row([label(arm), *("–" if e is None else _with_form(s.outcome, Interval.from_dict(e))
                                        for s, e in zip(sections, entries)),
                          seeds, *(f(arm) for f in extra.values())]))
    return lines


def panels(section: Section, name: Callable[[tuple], str] = lambda s: ", ".join(map(str, s))) \
        -> list[tuple[str, list[dict], Outcome]]:
    """``figure``'s panels for a section: one per setting, titled ``name(setting)``."""
    out: dict[tuple, list[dict]] = {}
    for r in section.summaries:
        out.setdefault(r["setting"], []).append(r)
    return [(name(setting), rows_, section.outcome) for setting, rows_ in out.items()]


def profile(panels: list[dict], path: Path, title: str = "", xlabel: str = "", ylabel: str = "",
            octaves: float = 0.3, ylim: tuple[float, float] | None = None) -> None:
    """Small multiples of a score along an axis (accuracy by key–query distance, say), over training seeds.

    Each panel is ``{"title", "series", "lines"}``; a series is ``{"label", "color", "marker", "x", "per_seed",
    "reference", "dotted"}`` with ``per_seed`` one list of values along ``x`` per training seed. A series is drawn
    at its mean over the seeds with a bar for its 95% t interval over them at each point (dashed: their range,
    under five seeds; none with one seed). The series sit side by side along the log-x axis (``octaves`` in all),
    so that no marker or bar hides another; a ``reference`` series (full attention) is a wide pale band under the
    rest; ``dotted`` (the same model averaged over K draws) has hollow markers. ``lines`` are vertical reference
    lines ``(x, label)`` named above the panel. ``ylim`` bounds a score's scale (a bar past it is cut at the axis).
    One legend for all panels, below them."""
    plt = pyplot()
    fig, axes = plt.subplots(1, len(panels), figsize=(4.4 * len(panels), 3.8), squeeze=False)
    legend: dict[str, object] = {}
    for ax, panel in zip(axes[0], panels):
        moving = [s for s in panel["series"] if not s.get("reference")]
        factor = dict(zip(map(id, moving), spread(len(moving), octaves)))
        for s in panel["series"]:
            values = np.asarray(s["per_seed"], dtype=np.float64)  # (seeds, points)
            mean = values.mean(axis=0)
            if s.get("reference"):
                ax.plot(s["x"], mean, "-", color=s["color"], alpha=0.35, linewidth=7, solid_capstyle="butt",
                        label=s["label"], zorder=1)
                continue
            xs = [x * factor[id(s)] for x in s["x"]]
            hollow = dict(markerfacecolor="none", markersize=7, markeredgewidth=1.2) if s.get("dotted") else \
                dict(markersize=4.5)
            ax.plot(xs, mean, ":" if s.get("dotted") else "-", marker=s["marker"], color=s["color"], linewidth=1.3,
                    label=s["label"], zorder=4 if s.get("dotted") else 3, **hollow)
            if len(values) > 1:
                cis = [t_interval(values[:, j], items=len(values), seeds=len(values)) for j in range(values.shape[1])]
                bars = ax.errorbar(xs, mean, yerr=[[m - c.lo for m, c in zip(mean, cis)],
                                                   [c.hi - m for m, c in zip(mean, cis)]],
                                   fmt="none", ecolor=s["color"], elinewidth=0.9, capsize=2, alpha=0.8, zorder=2)
                if len(values) < MIN_UNITS:
                    for line in bars[2]:
                        line.set_linestyle("--")
        for x, name in panel.get("lines", []):
            ax.axvline(x, color="0.35", linestyle="--", linewidth=1, zorder=1.5)
            # above the plotting area (x in data, y in axes units), where no series can run under it
            ax.text(x, 1.01, name, transform=ax.get_xaxis_transform(), ha="center", va="bottom", color="0.35",
                    fontsize=7)
        ax.set(xscale="log", xlabel=xlabel, ylabel=ylabel, **({"ylim": ylim} if ylim else {}))
        ax.set_title(panel["title"], pad=14, fontsize=9)
        ax.grid(alpha=0.3, which="both")
        for handle, name in zip(*ax.get_legend_handles_labels()):
            legend.setdefault(name, handle)
    fig.suptitle((title + "\n" if title else "") + f"mean over training seeds; bar: 95% t interval over the seeds "
                 f"(dashed: their range, under {MIN_UNITS} seeds)", fontsize=8)
    fig.tight_layout()
    fig.legend(list(legend.values()), list(legend), loc="upper center", bbox_to_anchor=(0.5, 0.0),
               ncol=min(len(legend), 4 * len(panels)), fontsize=7, frameon=False)
    save_figure(fig, path, dpi=150, bbox_inches="tight")
