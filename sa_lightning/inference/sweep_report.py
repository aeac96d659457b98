"""The tables and plots of a training-free sweep (``cli.py sweep``), made from the cell files its run wrote.

``results.json``, ``results.csv``, ``table.md`` (rows w_eff x mode, columns the tasks and their average; best
in bold and second underlined within each w_eff; every number with its 95% interval, ``compare.intervals``, and
the stochastic modes' seed-to-seed spread in a table of its own), ``compare.md`` and ``compare.json`` (the paired
comparisons and the ΔNLL against full attention, ``compare.py``), and the plots ``average.png`` (Figure 4),
``tasks.png`` (Figures 5-8), ``budget.png`` (score against keys per query), ``position.png`` (perplexity by
position) and, for a sweep over several prompt lengths, ``regime.png`` (ΔNLL against w_eff / n).

``report`` makes them from the records the runner hands over (each cell read once); the sweep experiment (``experiments.sweep``) writes them, with ``config.json``, as every
experiment writes its set (``experiments.base.write_report``): all at once, the previous set whole on a failure.
"""
from __future__ import annotations

import math
import statistics
from pathlib import Path

from ..eval.position import is_position_task
from ..attention import get_variant, variant_label
from ..attention.variants import FULL
from ..utils.report import head, number, pyplot, ranked_cells, row, save_figure, score, spread
from ..utils.stats import Interval
from . import compare
from .plan import SweepConfig, column_label, lower_is_better, metric_of

#: what each interval of a table row holds, as ``<column>:<field>`` keys of the row
INTERVAL_FIELDS = ("lo", "hi", "items", "seeds", "seed_sd", "form", "units")


def collect(cfg: SweepConfig, records: list[dict], loaded: compare.Loaded | None = None) -> list[dict]:
    """One row per (mode, w_eff, sink): each task's metric averaged over seeds (accuracies in %), ``avg`` the
    mean of the accuracy tasks (perplexities stay out of it), ``kpq`` the keys per query averaged over the
    same accuracy tasks (so ``avg`` and ``kpq`` describe one set of inputs), ``kpq:<task>`` each task's own, and ``pos:<task>`` the perplexity by position of a
    ``position_ppl_*`` task, from the cells' ``records``. With ``loaded`` (``compare.load``), each column's interval as ``<column>:lo``,
    ``:hi``, ``:items``, ``:seeds`` and, for a mode run at several seeds, ``:seed_sd``."""
    rows: dict[tuple, dict] = {}
    for rec in records:
        key = (rec["mode"], rec["w_eff"], rec["sink"])
        entry = rows.setdefault(key, {"mode": key[0], "w_eff": key[1], "sink": key[2], "tasks": {}, "kpq": {},
                                      "pos": {}})
        _, value = metric_of(rec["task"], rec["metrics"])
        if value is not None:
            entry["tasks"].setdefault(rec["task"], []).append(value)
        if rec.get("keys_per_query") is not None:
            entry["kpq"].setdefault(rec["task"], []).append(rec["keys_per_query"])
        if is_position_task(rec["task"]):
            for name, v in rec["metrics"].items():
                if name.startswith("ppl@"):
                    entry["pos"].setdefault(rec["task"], {}).setdefault(name, []).append(v)
    table = [_summary(cfg, entry) for entry in rows.values()]
    for r in table if loaded is not None else []:
        for col, interval in compare.intervals(cfg, loaded, (r["mode"], r["w_eff"], r["sink"])).items():
            fields = interval.as_dict()
            r.update({f"{col}:{name}": fields.get(name) for name in INTERVAL_FIELDS})
    return table


def _summary(cfg: SweepConfig, entry: dict) -> dict:
    """One table row from a (mode, w_eff, sink)'s collected values."""
    scores = {t: statistics.fmean(v) * (1 if lower_is_better(t) else 100) for t, v in entry["tasks"].items()}
    accuracy = [t for t in cfg.tasks if not lower_is_better(t)]
    done = [scores[t] for t in accuracy if t in scores]
    budgets = {t: statistics.fmean(v) for t, v in entry["kpq"].items()}
    summary = {"mode": entry["mode"], "w_eff": entry["w_eff"], "sink": entry["sink"], **scores,
               "avg": statistics.fmean(done) if done and len(done) == len(accuracy) else None,
               "kpq": _mean([budgets[t] for t in accuracy if t in budgets])}
    summary.update({f"kpq:{t}": b for t, b in budgets.items()})
    for task, by_bucket in entry["pos"].items():
        summary[f"pos:{task}"] = {name: statistics.fmean(v) for name, v in by_bucket.items()}
    return summary


def _mean(values: list[float]) -> float | None:
    return statistics.fmean(values) if values else None


def _row_order(cfg: SweepConfig):
    return lambda r: (cfg.modes.index(r["mode"]), r["sink"])


def _scored(r: dict, col: str, lower: bool) -> str:
    """A table cell: the score and, where its items were kept, its interval (``31.2 [12.5, 50.0]``)."""
    if r.get(col) is None or r.get(f"{col}:items") is None:
        return score(r.get(col), lower)
    return Interval.from_dict({name: r.get(f"{col}:{name}") for name in INTERVAL_FIELDS} | {"mean": r[col]}).text(
        ".2f" if lower else ".1f")


def markdown(cfg: SweepConfig, table: list[dict], missing: str | None = None) -> str:
    """The table (intervals in its cells), how they were made, and the seed-to-seed spread of the stochastic
    modes; ``missing``: the sentence naming the grid's cells not done."""
    cols = [*cfg.tasks, "avg"]
    lower = {c: lower_is_better(c) for c in cfg.tasks} | {"avg": False}
    heads = [column_label(t) + (" ↓" if lower[t] else "") for t in cfg.tasks]
    lines = head(["w_eff", "Mode", "keys/q", *heads, "Avg."], ["---", "---", "---:", *["---"] * len(cols)])
    for w in sorted({r["w_eff"] for r in table if r["w_eff"] is not None}):
        group = sorted((r for r in table if r["w_eff"] == w), key=_row_order(cfg))
        marked = [ranked_cells([r.get(col) for r in group], [_scored(r, col, lower[col]) for r in group], lower[col])
                  for col in cols]
        for i, r in enumerate(group):
            lines.append(row([w, variant_label(r["mode"], sink=r["sink"]), number(r.get("kpq"), ".1f"),
                              *(column[i] for column in marked)]))
    for r in table:
        if not get_variant(r["mode"]).sparse:
            lines.append(row(["all", FULL.label, number(r.get("kpq"), ".1f"),
                              *(_scored(r, c, lower[c]) for c in cols)]))
    lines += ["", compare.method_note(cfg)] + ([f"**{missing}**"] if missing else [])
    return "\n".join(lines + _spread_table(cfg, table, cols, heads + ["Avg."])) + "\n"


def _spread_table(cfg: SweepConfig, table: list[dict], cols: list[str], heads: list[str]) -> list[str]:
    """The seed-to-seed spread of the rows run at several seeds: the SD over seeds of each seed's score."""
    spread = sorted((r for r in table if any(r.get(f"{c}:seed_sd") is not None for c in cols)),
                    key=lambda r: (r["w_eff"] or 0, *_row_order(cfg)(r)))
    if not spread:
        return []
    lines = ["", "Seed-to-seed spread: the standard deviation over seeds of each seed's score (not an interval).", ""]
    lines += head(["w_eff", "Mode", "Seeds", *heads], ["---", "---", "---:", *["---:"] * len(cols)])
    for r in spread:
        seeds = max(r.get(f"{c}:seeds") or 0 for c in cols)
        lines.append(row([r["w_eff"] or "all", variant_label(r["mode"], sink=r["sink"]), seeds,
                          *(number(r.get(f"{c}:seed_sd"), ".2f" if c != "avg" and lower_is_better(c) else ".1f")
                            for c in cols)]))
    return lines


def _series(cfg: SweepConfig, table: list[dict]):
    """(mode, sink, rows) for every line of the plots, in the config's order."""
    for mode in cfg.modes:
        if not get_variant(mode).sparse:  # the reference, drawn on its own
            continue
        for sink in sorted({r["sink"] for r in table if r["mode"] == mode}):
            yield mode, sink, [r for r in table if r["mode"] == mode and r["sink"] == sink]


#: how far apart (in octaves of w_eff) the series' markers are spread at each window, so equal scores sit side by side
DODGE = 0.25


def _style(mode: str, sink: int) -> dict:
    color = get_variant(mode).color
    return {"color": color, "linestyle": "--" if sink else "-", "marker": get_variant(mode).marker,
            "markersize": 5.5, "markerfacecolor": "none" if sink else color, "markeredgewidth": 1.2,
            "linewidth": 1.4, "zorder": 3, "label": variant_label(mode, sink=sink)}


#: full attention, the reference every mode is compared with: a pale band drawn first, under every other line
FULL_STYLE = {"color": "gray", "alpha": 0.35, "linewidth": 6, "solid_capstyle": "butt", "zorder": 1}


def _legend(fig, axes) -> None:
    """One legend for the whole figure, outside every axis that holds data, so it covers none: in the first
    unused panel where the grid has one, else below the panels."""
    handles: dict[str, object] = {}
    for ax in axes.flat:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(label, handle)
    if not handles:
        return
    spare = [ax for ax in axes.flat if not ax.axison]  # the panels _panels hid
    if spare:
        spare[0].legend(list(handles.values()), list(handles), loc="center", fontsize=9, frameon=False)
    else:
        fig.legend(list(handles.values()), list(handles), loc="upper center", bbox_to_anchor=(0.5, 0.0),
                   ncol=min(len(handles), 4), fontsize=8, frameon=False)


def _panels(n_panels: int):
    """A figure of ``n_panels`` panels, at most 4 a row; the unused ones hidden."""
    ncol = min(4, n_panels)
    nrow = -(-n_panels // ncol)
    fig, axes = pyplot().subplots(nrow, ncol, figsize=(4.2 * ncol, 3.3 * nrow), squeeze=False)
    for ax in list(axes.flat)[n_panels:]:
        ax.axis("off")
    return fig, axes


def _ylabel(col: str) -> str:
    return "perplexity" if col != "avg" and lower_is_better(col) else "accuracy (%)"


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    save_figure(fig, path, dpi=150, bbox_inches="tight")  # "tight" grows the image to hold the legend below
    return path


def score_plot(cfg: SweepConfig, table: list[dict], path: Path, columns: list[str], x_of: str | None) -> Path:
    """Figures 4-8 (score against w_eff) and budget.png (the same scores against the keys each query attended)."""
    full = next((r for r in table if not get_variant(r["mode"]).sparse), None)
    fig, axes = _panels(len(columns))
    for ax, col in zip(axes.flat, columns):
        xkey = None if x_of is None else ("kpq" if col == "avg" else f"kpq:{col}")
        if full is not None and full.get(col) is not None:
            ax.axhline(full[col], label=FULL.label, **FULL_STYLE)
        series = list(_series(cfg, table))
        # at each w_eff the series sit a little apart; the measured budget (x_of) is plotted as measured
        dodges = spread(len(series), DODGE) if xkey is None else [1.0] * len(series)
        for (mode, sink, rows), dodge in zip(series, dodges):
            pts = sorted((r["w_eff"] if xkey is None else r.get(xkey), r[col], r.get(f"{col}:lo"),
                          r.get(f"{col}:hi")) for r in rows
                         if r.get(col) is not None and (xkey is None or r.get(xkey) is not None))
            if pts:
                style = _style(mode, sink)
                xs, ys = [p[0] * dodge for p in pts], [p[1] for p in pts]
                ax.plot(xs, ys, **style)
                bars = [(x, y, lo, hi) for x, (_, y, lo, hi) in zip(xs, pts) if lo is not None and hi is not None]
                if bars:  # the table's interval (or range) of each point, thin, in the series' colour
                    ax.errorbar([b[0] for b in bars], [b[1] for b in bars],
                                yerr=[[max(0.0, b[1] - b[2]) for b in bars], [max(0.0, b[3] - b[1]) for b in bars]],
                                linestyle="none", color=style["color"], elinewidth=0.8, capsize=1.5, alpha=0.6,
                                zorder=2)
        ax.set_xscale("log", base=2)
        if xkey is None:
            ticks = sorted({r["w_eff"] for r in table if r["w_eff"] is not None})
            ax.set_xticks(ticks, [str(t) for t in ticks])
            ax.minorticks_off()
        ax.set(xlabel="effective window $w_{eff}$" if xkey is None else "keys per query (measured)",
               ylabel=_ylabel(col), title="Average" if col == "avg" else column_label(col))
        if col != "avg" and lower_is_better(col):
            ax.set_yscale("log")
        ax.grid(alpha=0.3, which="both")
    _legend(fig, axes)
    seeds = f"σ seeds {', '.join(map(str, cfg.seeds))}" if len(cfg.seeds) > 1 else f"σ seed {cfg.seeds[0]}"
    fig.suptitle(f"{cfg.model}: training-free prefill attention" +
                 (", score against the measured budget" if x_of else "") +
                 f"\n{f'{cfg.limit:g}' if cfg.limit else 'all'} documents per task (task_limits apart), {seeds}; "
                 "bars: 95% interval "
                 "over documents (a range under five)", fontsize=9)
    return _save(fig, path)


def position_plot(cfg: SweepConfig, table: list[dict], path: Path) -> Path | None:
    """position.png: perplexity by distance from the start, one panel per (position task, window)."""
    tasks = [t for t in cfg.tasks if is_position_task(t)]
    windows = sorted({r["w_eff"] for r in table if r["w_eff"] is not None})
    if not tasks or not windows:
        return None
    full = next((r for r in table if not get_variant(r["mode"]).sparse), None)
    panels = [(t, w) for t in tasks for w in windows]
    fig, axes = _panels(len(panels))
    for ax, (task, w) in zip(axes.flat, panels):
        if full and f"pos:{task}" in full:
            _draw_buckets(ax, full[f"pos:{task}"], label=FULL.label, **FULL_STYLE)
        series = list(_series(cfg, table))
        # in each bucket the series sit a little apart, so equal perplexities (SWA+sink4 and SA+SWA+sink4, every
        # mode in the buckets w covers) show side by side
        for (mode, sink, rows), dodge in zip(series, spread(len(series), DODGE)):
            found = next((r for r in rows if r["w_eff"] == w and f"pos:{task}" in r), None)
            if found:
                _draw_buckets(ax, found[f"pos:{task}"], dodge=dodge, **_style(mode, sink))
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set(xlabel="tokens before the predicted one", ylabel="perplexity", title=f"{column_label(task)}, w_eff={w}")
        ax.grid(alpha=0.3, which="both")
    _legend(fig, axes)
    fig.suptitle(f"{cfg.model}: perplexity by position", fontsize=10)
    return _save(fig, path)


#: regime.png's y axis is linear within ±this many nats (symlog's linear part), and wholly linear for a panel inside it
REGIME_LINEAR = 0.1


def regime_plot(cfg: SweepConfig, regime: list[dict], path: Path) -> Path | None:
    """regime.png (a sweep over several prompt lengths): ΔNLL against full over all tokens against w_eff / n, one
    panel per sink, then one panel per windowed comparison (A − B, the sinks as line styles); each point a (n,
    w_eff) with its 95% interval, a line through the mean of the points at each w_eff / n."""
    if not regime:
        return None
    sinks = sorted({r["sink"] for r in regime if r["kind"] == "delta"})
    paired = list(dict.fromkeys(compare.regime_label(r) for r in regime if r["kind"] == "paired"))
    panels = [("delta", sink) for sink in sinks] + [("paired", label) for label in paired]
    fig, axes = _panels(len(panels))
    modes = [m for m in cfg.modes if get_variant(m).sparse]
    for ax, (kind, which) in zip(axes.flat, panels):
        if kind == "delta":
            groups = [((m, which), [r for r in regime if r["kind"] == kind and r["a"] == m and r["sink"] == which])
                      for m in modes]
            title = f"ΔNLL against {FULL.label}" + (f", sink {which}" if which else ", no sink")
        else:
            groups = [((None, sink), [r for r in regime if r["kind"] == kind and compare.regime_label(r) == which
                                      and r["sink"] == sink]) for sink in sinks]
            title = which
        groups = [(key, rs) for key, rs in groups if rs]
        for ((mode, sink), rs), dodge in zip(groups, spread(len(groups), DODGE)):
            style = _style(mode or rs[0]["a"], sink)
            if mode is None:
                style.update(color="black", marker="o", markerfacecolor="none" if sink else "black",
                             label=f"sink {sink}" if sink else "no sink")
            xs = [r["ratio"] * dodge for r in rs]
            ys = [r["mean"] for r in rs]
            err = [[r["mean"] - r["lo"] if r["lo"] is not None else 0 for r in rs],
                   [r["hi"] - r["mean"] if r["hi"] is not None else 0 for r in rs]]
            ax.errorbar(xs, ys, yerr=err, linestyle="none", capsize=0, elinewidth=0.8, alpha=0.7,
                        **{k: v for k, v in style.items() if k not in ("linestyle", "label", "linewidth")})
            ratios = sorted({r["ratio"] for r in rs})
            means = [statistics.fmean(r["mean"] for r in rs if r["ratio"] == x) for x in ratios]
            ax.plot([x * dodge for x in ratios], means, **{**style, "marker": None})
        ax.axhline(0, color="gray", linewidth=0.8)
        ax.set_xscale("log", base=2)
        # symlog where the panel spans orders of magnitude; a panel wholly within its linear part (two masks
        # that tie, within ±0.1 nats) stays linear, where symlog would label its ticks as 2.89 x 10^-2
        extent = max((abs(v) for _, rs in groups for r in rs for v in (r["lo"], r["mean"], r["hi"]) if v is not None),
                     default=0.0)
        if extent >= REGIME_LINEAR:
            ax.set_yscale("symlog", linthresh=REGIME_LINEAR)
        ax.set(xlabel="window / prompt length ($w_{eff}/n$)", ylabel="nats per token", title=title)
        ax.grid(alpha=0.3, which="both")
    _legend(fig, axes)
    fig.suptitle(f"{cfg.model}: the regime, ΔNLL against the share of the prompt a window covers "
                 f"(n in {sorted({r['n'] for r in regime})})", fontsize=10)
    return _save(fig, path)


def _draw_buckets(ax, by_bucket: dict[str, float], dodge: float = 1.0, **style) -> None:
    """One line through the buckets' perplexities, each at its bucket's geometric middle times ``dodge``."""
    pts = []
    for name, value in by_bucket.items():
        lo, hi = (int(x) for x in name.removeprefix("ppl@").split("-"))
        pts.append((math.sqrt(lo * (hi + 1)) * dodge, value))  # the bucket's geometric middle, nudged
    ax.plot(*zip(*sorted(pts)), **style)


def figures(cfg: SweepConfig, table: list[dict], regime: list[dict]) -> dict:
    """The sweep's figures, each drawn into the path given (None: nothing to draw): ``average.png`` (Figure 4),
    ``tasks.png`` (Figures 5-8), ``budget.png`` (score against the measured keys per query), ``position.png`` and
    ``regime.png``."""
    return {"average.png": lambda path: score_plot(cfg, table, path, ["avg"], None),
            "tasks.png": lambda path: score_plot(cfg, table, path, cfg.tasks, None),
            "budget.png": lambda path: score_plot(cfg, table, path, ["avg", *cfg.tasks], "kpq"),
            "position.png": lambda path: position_plot(cfg, table, path),
            "regime.png": lambda path: regime_plot(cfg, regime, path)}


def report(cfg: SweepConfig, records: list[dict], out: Path) -> dict:
    """What the sweep's report holds, from the records of its cells (each read once, by the runner): ``table``
    (table.md), ``rows`` and ``csv_fields`` (results.csv, results.json), ``compared`` (``compare.Compared``) and
    ``figures``."""
    loaded = compare.load(cfg, records)
    table = collect(cfg, records, loaded)
    text = markdown(cfg, table, compare.missing_sentence(out, loaded.missing))
    cols = [*cfg.tasks, "avg"]
    compared = compare.build(cfg, out, loaded)
    return {"table": text, "rows": table, "compared": compared, "figures": figures(cfg, table, compared.regime),
            "csv_fields": ["mode", "w_eff", "sink", *cols, "kpq", *(f"kpq:{t}" for t in cfg.tasks),
                           *(f"{c}:{name}" for c in cols for name in INTERVAL_FIELDS)]}
