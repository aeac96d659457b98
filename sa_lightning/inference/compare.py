"""The statistics of a training-free sweep: the intervals of its tables and its paired comparisons.

Every cell keeps its per-item records beside its record (``utils.runner.write_cell``): each lm-eval document's scores,
each ``position_ppl_*`` document's per-token NLL. From them, for each setting (mode, w_eff, sink) and task:

- ``intervals``: the 95% interval of each number in ``table.md`` (``utils.stats``: a bootstrap over items for a
  mode run at one seed, the two-level bootstrap for the modes run at several, with the seed-to-seed spread);
- ``comparison_rows``: the config's ``comparisons``, A − B on the same items with its interval and verdict;
- ``delta_nll_rows``: the language-model signal, NLL(mode) − NLL(full) on the same tokens, by position bucket,
  with intervals from resampling documents (and seeds within each);
- ``regime_rows``: for a sweep over several prompt lengths n, those ΔNLLs and the windowed comparisons against
  w_eff / n (``regime.png``): does a deficit shrink as the window covers more of the prompt?

``build`` makes the last two, for ``compare.md`` and ``compare.json`` in the report's set of files, from the records
the runner handed over (each read once). A cell of the grid with no finished record (``--compare`` before it ran)
is left out of all of it and named in one sentence.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from ..attention import get_variant, variant_label
from ..attention.variants import FULL, SWA
from ..eval.position import bucket_name, buckets, context_length, is_position_task
from ..utils.items import Items, align, paired
from ..utils.report import Column, ab_table, head, row
from ..utils.stats import (HEADROOM_NOTE, LEVEL, MIN_UNITS, RESAMPLES, SEGMENT, Interval,
                           comparison_row, derived_seed, documents_difference, headroom, headroom_label,
                           mean_of_tasks, percentile_interval, replicates, seed_spread)
from .plan import Comparison, SweepConfig, cells, column_label, comparisons_of, lower_is_better, metric_of

#: (mode, w_eff, sink)
Setting = tuple


@dataclass
class TaskScores(Items):
    """One setting's items on one task, over its σ seeds (``utils.items.Items``): accuracy items in points (0 or 100
    for a 0/1 metric), a perplexity task's documents as their mean NLL per token (nats), with its per-token NLL;
    ``kpq`` the keys each query attended, measured."""

    kpq: float | None = None


@dataclass
class Loaded:
    scores: dict[tuple[Setting, str], TaskScores]
    missing: list[str]  # keys of the grid's cells with no finished record here (--compare: not run, or damaged)


def item_values(task: str, metrics: dict, items: list[dict]) -> tuple[list, list[float], list | None] | None:
    """(ids, one value per item, per-token NLL or None) of a cell's per-item records: what a sweep keeps of them
    (``experiments.sweep``'s ``loaded``); None when its column's metric is not a number per item (a rolling
    perplexity)."""
    ids = [item["doc_id"] for item in items]
    if is_position_task(task):
        nll = [item["nll"] for item in items]
        return ids, [float(np.mean(x)) for x in nll], nll
    name, _ = metric_of(task, metrics)
    if name is None or not items or any(name not in item.get("scores", {}) for item in items):
        return None
    return ids, [100.0 * item["scores"][name] for item in items], None


def load(cfg: SweepConfig, records: list[dict]) -> Loaded:
    """The records the runner handed over (each with its items as numbers, ``item_values``), gathered by (setting,
    task) over seeds and aligned by item; the grid's cells without one named as missing."""
    gathered: dict[tuple[Setting, str], list] = {}
    for r in records:
        if r.get("values") is not None:
            gathered.setdefault(((r["mode"], r["w_eff"], r["sink"]), r["task"]), []).append(
                (r["seed"], *r["values"], r.get("keys_per_query")))
    done = {(r["mode"], r["w_eff"], r["sink"], r["seed"], r["task"]) for r in records}
    missing = [c.key for c in cells(cfg) if (c.mode, c.w_eff, c.sink, c.seed, c.task) not in done]
    return Loaded({key: _aligned(runs) for key, runs in gathered.items()}, missing)


def _aligned(runs: list) -> TaskScores:
    """One setting's seeds on the items all of them scored (``utils.items.align``), with their mean keys per query."""
    found = align([run[:4] for run in runs])
    kpqs = [run[4] for run in runs if run[4] is not None]
    return TaskScores(found.ids, found.matrix, found.seeds, found.tokens, float(np.mean(kpqs)) if kpqs else None)


# ---- the tables' intervals -------------------------------------------------------------------------
def intervals(cfg: SweepConfig, loaded: Loaded, setting: Setting) -> dict[str, Interval]:
    """Each task's interval for one setting, in the table's units (accuracy in %, perplexity), and ``avg``'s: the
    mean of the accuracy tasks' replicates (their items are independent), present when every accuracy task has
    records."""
    out, reps, per_seed = {}, {}, {}
    for task in cfg.tasks:
        scores = loaded.scores.get((setting, task))
        if scores is None:
            continue
        values = scores.units()
        reps[task] = replicates(values, resamples=RESAMPLES, seed=derived_seed(0, task, *setting))
        per_seed[task] = values.mean(axis=1)
        interval = percentile_interval(values.mean(), reps[task], values.shape[1], values=values.mean(axis=0),
                                       seeds=len(scores.seeds), seed_sd=seed_spread(values))
        if lower_is_better(task):  # mean NLL -> perplexity, bound by bound; the spread of each seed's perplexity
            spread = float(np.exp(per_seed[task]).std(ddof=1)) if len(per_seed[task]) > 1 else None
            interval = replace(interval.map(math.exp), seed_sd=spread)
        out[task] = interval
    accuracy = [t for t in cfg.tasks if not lower_is_better(t)]
    if accuracy and all(t in reps for t in accuracy):
        out["avg"] = mean_of_tasks([(out[t].mean, reps[t], out[t].items, per_seed[t]) for t in accuracy])
    return out


def method_note(cfg: SweepConfig) -> str:
    """How the table's intervals are made, for the footnote of ``table.md``."""
    several = [variant_label(m) for m in cfg.modes if m in cfg.seed_modes] if len(cfg.seeds) > 1 else []
    stochastic = (f"{', '.join(several)} (seeds {', '.join(map(str, cfg.seeds))}): σ is drawn per input, so each "
                  "item counts as its mean over the seeds and the bootstrap draws the items; the seed-to-seed spread "
                  "(SD over seeds of each seed's score) is the table below. " if several else "")
    ppl = ("PPL: the interval of the mean NLL per document, as a perplexity. "
           if any(lower_is_better(t) for t in cfg.tasks) else "")
    return (f"Each score is mean [95% interval], {RESAMPLES} resamples: a percentile bootstrap over the task's items "
            f"(documents), widened by the small-sample factor (`utils.stats`). {stochastic}{one_draw_note(cfg)}{ppl}"
            f"A perplexity task with fewer than {MIN_UNITS} documents is cut into segments of {SEGMENT} tokens, each "
            "one unit (a block bootstrap). Avg.: the mean of the tasks' replicates. \"range\": fewer than "
            f"{MIN_UNITS} units, no 95% interval, only their smallest and largest values.")


def one_draw_note(cfg: SweepConfig) -> str:
    """A sentence naming the modes that draw (σ, hash seeds) but ran one seed here: their intervals hold the
    documents' noise and one draw's, not the draw-to-draw spread, so they are narrower than a several-seed mode's
    would be. Empty where every drawing mode ran several seeds."""
    several = len(cfg.seeds) > 1
    single = [variant_label(m) for m in cfg.modes if get_variant(m).draws and not (several and m in cfg.seed_modes)]
    if not single:
        return ""
    one = len(single) == 1
    return (f"{', '.join(single)} draw{'s' if one else ''} at random but ran one seed here (seed {cfg.seeds[0]}; "
            f"the config's seeds and seed_modes): {'its' if one else 'their'} intervals and comparisons hold the "
            "documents' noise within that one draw, not the draw-to-draw spread, so they are narrower than they would "
            "be over several seeds. ")


# ---- paired comparisons ----------------------------------------------------------------------------
def _settings(loaded: Loaded, mode: str, task: str) -> list[Setting]:
    return sorted({s for s, t in loaded.scores if s[0] == mode and t == task}, key=lambda s: (s[1] or 0, s[2]))


def _partners(comp: Comparison, a: Setting, task: str, loaded: Loaded) -> list[Setting]:
    """B's settings that ``a`` is compared with on ``task``: a setting without a window (full) pairs with every
    one of the other side; else the same sink, at the same w_eff, twice it, or the nearest keys per query."""
    found = _settings(loaded, comp.b, task)
    if a[1] is None or any(b[1] is None for b in found):
        return found
    same_sink = [b for b in found if b[2] == a[2]]
    if comp.match == "equal_w":
        return [b for b in same_sink if b[1] == a[1]]
    if comp.match == "double_w":
        return [b for b in same_sink if b[1] == 2 * a[1]]
    kpq_a = loaded.scores[(a, task)].kpq
    measured = [b for b in same_sink if loaded.scores[(b, task)].kpq is not None]
    if kpq_a is None or not measured:
        return []
    return [min(measured, key=lambda b: (abs(loaded.scores[(b, task)].kpq - kpq_a), b[1]))]


def headroom_at(loaded: Loaded, task: str, w_eff: int | None, sink: int) -> bool | None:
    """The positive control at one setting: does full attention beat SWA at ``w_eff`` (same task and sink) by more
    than the interval? None where either cell is missing (or no window is given)."""
    full = next((s for s, t in loaded.scores if t == task and s[0] == FULL.name), None)
    swa = (SWA.name, w_eff, sink)
    if full is None or w_eff is None or (swa, task) not in loaded.scores:
        return None
    diff = paired(loaded.scores[(full, task)], loaded.scores[(swa, task)], derived_seed(0, task, *full, *swa))
    return headroom(diff, lower_is_better(task))


def comparison_rows(cfg: SweepConfig, loaded: Loaded) -> list[dict]:
    """One row per (comparison, A's setting, task): A − B on the items both scored, its interval and verdict, and
    whether the setting has headroom (``headroom_at`` B's window and sink; None on the positive control's own
    rows, Full against SWA)."""
    rows, controls = [], {}
    for comp in comparisons_of(cfg):
        for task in cfg.tasks:
            for a in _settings(loaded, comp.a, task):
                if comp.sink is not None and a[2] != comp.sink:
                    continue
                for b in _partners(comp, a, task, loaded):
                    sa, sb = loaded.scores[(a, task)], loaded.scores[(b, task)]
                    diff = paired(sa, sb, derived_seed(0, task, *a, *b))
                    if diff is None:
                        continue
                    control = FULL.name in (comp.a, comp.b)  # the positive control itself
                    at = (task, b[1] or a[1], b[2])
                    if not control and at not in controls:
                        controls[at] = headroom_at(loaded, *at)
                    rows.append({"setting": [task, a[1], a[2]], "a": comp.a, "b": comp.b, "outcome": task,
                                 "match": comp.match, "task": task, "a_sink": a[2],
                                 "b_sink": b[2], "a_w_eff": a[1], "b_w_eff": b[1], "a_kpq": sa.kpq, "b_kpq": sb.kpq,
                                 "unit": "nats/token" if lower_is_better(task) else "points",
                                 **comparison_row(diff, lower_is_better(task)),
                                 "headroom": None if control else controls[at]})
    return rows


# ---- the language-model signal: ΔNLL against full attention by position --------------------------
def delta_nll_rows(cfg: SweepConfig, loaded: Loaded) -> list[dict]:
    """Per position task and sparse setting: NLL(setting) − NLL(full) per token on the same documents, in each
    position bucket and over all tokens, with intervals from resampling documents (and seeds within each)."""
    rows = []
    for task in (t for t in cfg.tasks if is_position_task(t)):
        refs = [s for s, t in loaded.scores if t == task and not get_variant(s[0]).sparse]
        if not refs:
            continue
        ref = loaded.scores[(refs[0], task)]
        for mode in cfg.modes:
            for setting in _settings(loaded, mode, task) if get_variant(mode).sparse else []:
                scores = loaded.scores[(setting, task)]
                ids = [i for i in scores.ids if i in set(ref.ids)]
                if not ids or scores.tokens is None or ref.tokens is None:
                    continue
                mine, full = scores.select(ids).tokens, ref.select(ids).tokens
                parts = {bucket_name(lo, hi): (lo - 1, hi - 1) for lo, hi in buckets(context_length(task))}
                parts["all"] = (0, mine.shape[2])
                cells_ = {}
                for name, (lo, hi) in parts.items():
                    diff = documents_difference(mine[:, :, lo:hi].mean(axis=2), mine[:, :, lo:hi],
                                                full[:, :, lo:hi].mean(axis=2), full[:, :, lo:hi],
                                                seed=derived_seed(0, task, *setting, name))
                    cells_[name] = comparison_row(diff, lower_is_better=True)
                rows.append({"task": task, "mode": setting[0], "w_eff": setting[1], "sink": setting[2],
                             "documents": len(ids), "seeds": len(scores.seeds), "buckets": cells_})
    return rows


# ---- the regime: how the deficit moves with the share of the prompt a window covers ------------------
def regime_rows(deltas: list[dict], rows: list[dict]) -> list[dict]:
    """For a sweep over several prompt lengths (two or more ``position_ppl_*`` tasks; else empty): each sparse
    setting's ΔNLL against full over all tokens at each prompt length n, with w_eff / n, and each configured
    comparison between two windowed settings (``rows``: A − B, per token) at the same (n, sink). The axis asks
    whether a mode's deficit shrinks, or flips, as its window covers more of the prompt."""
    if len({d["task"] for d in deltas}) < 2:
        return []
    out = []
    for d in deltas:
        n = context_length(d["task"])
        out.append({"kind": "delta", "a": d["mode"], "b": FULL.name, "n": n, "w_eff": d["w_eff"], "sink": d["sink"],
                    "ratio": d["w_eff"] / n, **d["buckets"]["all"], "seeds": d["seeds"]})
    for r in rows:
        if is_position_task(r["task"]) and r["a_w_eff"] is not None and r["b_w_eff"] is not None:
            n = context_length(r["task"])
            out.append({**r, "kind": "paired", "n": n, "w_eff": r["a_w_eff"], "sink": r["a_sink"],
                        "ratio": r["a_w_eff"] / n})
    return out


def regime_label(r: dict) -> str:
    """The column of a regime row: the mode (its ΔNLL against full), or the comparison A − B."""
    if r["kind"] == "delta":
        return variant_label(r["a"])
    return _comparison_label(r["a"], r["b"], r["match"])


def regime_markdown(regime: list[dict]) -> list[str]:
    """The regime table: one line per (sink, w_eff, n), one column per mode's ΔNLL against full and per paired
    comparison, each mean [95% interval] in nats per token."""
    if not regime:
        return []
    columns = list(dict.fromkeys(regime_label(r) for r in regime))
    at = {(regime_label(r), r["sink"], r["w_eff"], r["n"]): r for r in regime}
    lines = ["", "## The regime: ΔNLL against full attention by prompt length n and window w_eff", "",
             "Over all predicted tokens of each length-n document, in nats per token (below 0: better than full). "
             "A mode's column is NLL(mode) − NLL(full); a comparison's column is A − B paired on the same tokens "
             "(below 0: A predicts better). Sorted by w_eff / n within each sink: does a deficit shrink as the "
             "window covers more of the prompt? 95% interval from resampling documents (and a stochastic mode's "
             "seeds within each). –: not run at that setting (MoBA takes no sink).", ""]
    lines += head(["Sink", "w_eff", "n", "w_eff/n", *columns], ["---:"] * 4 + ["---"] * len(columns))
    for sink, w_eff, n in sorted({(r["sink"], r["w_eff"], r["n"]) for r in regime},
                                 key=lambda k: (k[0], k[1] / k[2], k[2])):
        found = [at.get((c, sink, w_eff, n)) for c in columns]
        lines.append(row([sink, w_eff, n, f"{w_eff / n:.3g}",
                          *(_interval_cell(r, "+.3f") if r else "–" for r in found)]))
    return lines


# ---- compare.md / compare.json ----------------------------------------------------------------------
def missing_sentence(out: Path, missing: list[str]) -> str | None:
    """The one sentence that names the grid's cells with no finished record in ``out`` (``--compare``), or None."""
    if not missing:
        return None
    names = ", ".join(missing[:6]) + (f" and {len(missing) - 6} more" if len(missing) > 6 else "")
    return (f"{len(missing)} cell(s) of this config have no finished record in {out / 'cells'} (not run yet, run "
            f"with other settings, or cut short) and are left out of every table, interval and comparison: {names}; "
            "run the sweep again without --compare to run them.")


def _interval_cell(d: dict, spec: str) -> str:
    return Interval.from_dict(d).text(spec)


def _match_label(r: dict) -> str:
    """How the row's B was chosen; a side without a window (full) meets the other at each of its windows."""
    return "each w" if r["a_w_eff"] is None or r["b_w_eff"] is None else r["match"].replace("_", " ")


def _setting_label(w_eff, kpq) -> str:
    return f"{w_eff or 'all'} ({kpq:.1f})" if kpq is not None else f"{w_eff or 'all'}"


def unpaired(cfg: SweepConfig, rows: list[dict]) -> list[Comparison]:
    """The configured comparisons with no pair of cells here: a mode this run leaves out (``--modes`` narrower than
    the config's), no B at twice A's window, or cells not done (``--compare``)."""
    found = {(r["a"], r["b"], r["match"]) for r in rows}
    return [c for c in comparisons_of(cfg) if (c.a, c.b, c.match) not in found]


def _comparison_label(a: str, b: str, match: str) -> str:
    return f"{variant_label(a)} − {variant_label(b)} ({match.replace('_', ' ')})"


def markdown(cfg: SweepConfig, rows: list[dict], deltas: list[dict], missing: str | None,
             regime: list[dict] = ()) -> str:
    lines = [f"# Paired comparisons: {cfg.model}", "",
             "A − B on the same items: lm-eval tasks in points of their column's metric, perplexity tasks as each "
             "document's mean NLL per token (nats; lower is better). 95% interval: a percentile bootstrap "
             f"({RESAMPLES} resamples) that draws the items once for both sides, each item its mean over a side's σ "
             f"seeds (σ is drawn per input); fewer than {MIN_UNITS} documents of a perplexity task are cut into "
             f"segments of {SEGMENT} tokens (a block bootstrap). The verdict is worded from the interval: better or "
             "worse when it excludes 0, else not separable at this size; with fewer than "
             f"{MIN_UNITS} units there is no interval, only a range, and the verdict says too few to decide. w_eff "
             "(keys/q): the setting's window and the keys per query it attended on that task, measured. "
             + one_draw_note(cfg)
             + HEADROOM_NOTE, ""]
    if missing:
        lines += [f"**{missing}**", ""]
    skipped = [_comparison_label(c.a, c.b, c.match) for c in unpaired(cfg, rows)]
    if skipped:
        lines += [f"No pair of cells in this run (a mode left out, no B at that window, or cells not done): "
                  f"{', '.join(skipped)}.", ""]
    if rows:
        lines += ab_table(rows, [
            Column("A", lambda r: variant_label(r["a"], sink=r["a_sink"])),
            Column("B", lambda r: variant_label(r["b"], sink=r["b_sink"])), Column("Match", _match_label),
            Column("Task", lambda r: column_label(r["task"])),
            Column("A w_eff (keys/q)", lambda r: _setting_label(r["a_w_eff"], r["a_kpq"]), "---:"),
            Column("B w_eff (keys/q)", lambda r: _setting_label(r["b_w_eff"], r["b_kpq"]), "---:"),
            Column("A − B [95%]", lambda r: _interval_cell(r, "+.3f" if r["unit"] == "nats/token" else "+.1f")),
            Column("Verdict", lambda r: r["verdict"]), Column("Headroom", lambda r: headroom_label(r.get("headroom"))),
            Column("Items", lambda r: r["items"], "---:"),
            Column("Seeds A/B", lambda r: f"{r['seeds']}/{r['seeds_b']}", "---:")])
    else:
        lines.append("No comparison: the config lists none (`comparisons:`), or their cells are not done.")
    for task in dict.fromkeys(d["task"] for d in deltas):
        names = list(next(d for d in deltas if d["task"] == task)["buckets"])
        lines += ["", f"## ΔNLL against full attention by position: {column_label(task)}", "",
                  "NLL(mode) − NLL(full) per token (nats) on the same documents and tokens, by the predicted token's "
                  "distance from the start; below 0 the mode predicts those tokens better than full. 95% interval from "
                  "resampling documents (and a stochastic mode's seeds within each); verdict on all tokens.", ""]
        lines += head(["w_eff", "Mode", *(n.removeprefix("ppl@") for n in names), "Verdict (all)", "Docs", "Seeds"],
                      ["---"] * 2 + ["---"] * len(names) + ["---", "---:", "---:"])
        for d in (d for d in deltas if d["task"] == task):
            lines.append(row([d["w_eff"], variant_label(d["mode"], sink=d["sink"]),
                              *(_interval_cell(d["buckets"][n], "+.3f") for n in names),
                              d["buckets"]["all"]["verdict"], d["documents"], d["seeds"]]))
    lines += regime_markdown(list(regime))
    return "\n".join(lines) + "\n"


@dataclass
class Compared:
    text: str  # compare.md
    rows: list[dict]
    deltas: list[dict]
    regime: list[dict]  # regime_rows: empty unless the sweep has several prompt lengths
    summary: str  # what the sweep prints: the verdicts counted per comparison
    extra: dict  # compare.json beside its rows


def summary(rows: list[dict], missing: str | None) -> str:
    """One line per comparison: how many of its rows each verdict has."""
    lines = []
    for key in dict.fromkeys((r["a"], r["b"], r["match"]) for r in rows):
        mine = [r for r in rows if (r["a"], r["b"], r["match"]) == key]
        verdicts = [r["verdict"] for r in mine]
        counts = ", ".join(f"{verdicts.count(v)} {v}" for v in dict.fromkeys(verdicts))
        decided = [r["verdict"] for r in mine if r.get("headroom")]
        if any(r.get("headroom") is not None for r in mine):
            counts += (f"; where full attention beats SWA ({len(decided)} of {len(mine)}): "
                       + (", ".join(f"{decided.count(v)} {v}" for v in dict.fromkeys(decided)) or "none"))
        lines.append(f"compare: {_comparison_label(key[0], key[1], _match_label(mine[0]).replace(' ', '_'))}: "
                     f"{counts}")
    return "\n".join(lines + ([missing] if missing else [])) or "compare: no comparison configured"


def build(cfg: SweepConfig, out: Path, loaded: Loaded) -> Compared:
    """``compare.md``'s text, ``compare.json``'s rows and its further tables (ΔNLL by position, the regime)."""
    rows, deltas = comparison_rows(cfg, loaded), delta_nll_rows(cfg, loaded)
    regime = regime_rows(deltas, rows)
    missing = missing_sentence(out, loaded.missing)
    text = markdown(cfg, rows, deltas, missing, regime)
    return Compared(text, rows, deltas, regime, summary(rows, missing),
                    {"resamples": RESAMPLES, "level": LEVEL, "delta_nll": deltas, "regime": regime,
                     "missing_cells": loaded.missing})
