"""``cli.py analyze map RUN [RUN ...]``: the map of where routing could matter (issue 76), from finished runs.

    python cli.py analyze map outputs/study/long_range_decide_map_n256_l4 outputs/study/long_range_decide_map_n512_l4

Each RUN is one long-range study's folder, one (n, L, w) cell of the map: its ``results.json`` (the config: n from
the fit's ``data.init_args.seq_len``, its depth, window and pre-registered margins) and its ``compare.json`` (each
comparison over training seeds, ``utils.trained``). For every comparison of ``--arm`` (SA) on ``--outcome`` (the
deciding presets' primary outcome, log p of the answer past SWA's field), the map holds A − B with its 95% and 90%
intervals and its verdict as the run worded it, beside the share of the distances past SWA's field that each arm's
own masks carry to the last query through L layers (``mechanism.reach_share``): where reach differs, an effect may
be reach; where both reach everything, it is routing. Written together (``utils.atomic.replacing_files``):
``map.md``, ``map.csv`` and ``map.png`` (one panel per control, one point per cell with its intervals, the margin
shaded, each arm's reach under its point). A run with no row for the outcome is named and left out.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from ..attention import variant_label
from ..utils.argtypes import doc_help
from ..utils.atomic import add_overwrite, output_folder, replacing_files, write_text
from ..utils.report import fmt, head, pyplot, row, save_figure
from ..utils.tables import write_csv
from .mechanism import reach_share

#: how the map names each outcome a long-range run scores
OUTCOMES = {"logp": "log p of the answer past the field (nats)", "acc": "accuracy past the field (share)"}


def run_cell(folder: Path) -> dict:
    """One run's cell of the map: its n, depth, window, margins and comparison rows; a folder without a finished
    report is refused in one sentence, naming it."""
    try:
        config = json.loads((folder / "results.json").read_text())["config"]
        rows = json.loads((folder / "compare.json").read_text())["comparisons"]
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ValueError(f"{folder} holds no finished long-range report (results.json and compare.json): "
                         f"{type(err).__name__}; run the study there first, or pass --compare to it for an "
                         "interim report.") from None
    n = (config.get("fit_overrides") or {}).get("data.init_args.seq_len")
    depths, windows = config.get("depths") or [], config.get("windows") or []
    if n is None or len(depths) != 1 or len(windows) != 1:
        raise ValueError(f"{folder}: a cell of the map is one n, one depth and one window (its results.json gives "
                         f"n {n}, depths {depths}, windows {windows}).")
    return {"folder": str(folder), "n": int(n), "depth": depths[0], "window": windows[0],
            "margins": config.get("margins") or {}, "rows": rows}


def map_rows(cells: list[dict], arm: str, outcome: str, trials: int = 4) -> tuple[list[dict], list[str]]:
    """One row per (cell, comparison of ``arm`` on ``outcome``), with each arm's reach past the field; and the
    cells that hold none."""
    out, missing, reach = [], [], {}

    def reached(variant: str, c: dict) -> float:
        key = (variant, c["n"], c["window"], c["depth"])
        if key not in reach:
            reach[key] = reach_share(variant, c["n"], c["window"], c["depth"], c["depth"] * (c["window"] - 1) + 1,
                                     trials=trials)
        return reach[key]

    for c in sorted(cells, key=lambda c: (c["n"], c["depth"], c["window"])):
        mine = [r for r in c["rows"] if r.get("a") == arm and r.get("outcome") == outcome]
        if not mine:
            missing.append(c["folder"])
        for r in mine:
            out.append({"n": c["n"], "L": c["depth"], "w": c["window"], "a": arm, "b": r["b"],
                        "outcome": outcome, "mean": r.get("mean"), "lo": r.get("lo"), "hi": r.get("hi"),
                        "lo90": r.get("lo90"), "hi90": r.get("hi90"), "margin": c["margins"].get(outcome),
                        "verdict": r.get("verdict"), "seeds": r.get("seeds"),
                        "reach_a": reached(arm, c), "reach_b": reached(r["b"], c), "run": c["folder"]})
    return out, missing


def _interval(lo, hi, spec: str) -> str:
    return "–" if lo is None or hi is None else f"[{fmt(lo, spec)}, {fmt(hi, spec)}]"


def markdown(rows: list[dict], arm: str, outcome: str, missing: list[str]) -> str:
    title = f"{variant_label(arm)} against each control, {OUTCOMES.get(outcome, outcome)}"
    lines = [f"# Where routing could matter: {title}", "",
             "A − B over training seeds, paired by seed, as each run's `compare.json` worded it (its pre-registered "
             "margin δ; \"equivalent within ±δ\" from two one-sided tests, the 90% interval inside ±δ). Reach: the "
             "share of the distances past SWA's field L·(w−1) that the arm's own masks carry to the last query "
             "through L layers (`analyze reach`); where both arms reach everything, a difference is routing, not "
             "reach.", ""]
    lines += head(["n", "L", "w", "A − B", "mean", "95%", "90%", "δ", "verdict", "seeds", "reach A", "reach B"],
                  ["---:"] * 3 + ["---"] + ["---:"] * 4 + ["---", "---:", "---:", "---:"])
    for r in rows:
        mean = "–" if r["mean"] is None else fmt(r["mean"], "+.3f")
        margin = "–" if r["margin"] is None else fmt(r["margin"], ".3g")
        lines.append(row([r["n"], r["L"], r["w"], f"{variant_label(r['a'])} − {variant_label(r['b'])}", mean,
                          _interval(r["lo"], r["hi"], "+.3f"), _interval(r["lo90"], r["hi90"], "+.3f"), margin,
                          r["verdict"], r["seeds"], f"{100 * r['reach_a']:.0f}%", f"{100 * r['reach_b']:.0f}%"]))
    if missing:
        lines += ["", f"No {variant_label(arm)} comparison on {outcome} in: {', '.join(missing)}."]
    return "\n".join(lines) + "\n"


def figure(rows: list[dict], path: Path, arm: str, outcome: str) -> bool:
    """map.png: one panel per control, x the map's cells (n, L), y A − B with its 95% (thin) and 90% (thick)
    intervals, ±δ shaded, 0 drawn, each arm's reach under its point. False where there is nothing to draw."""
    controls = list(dict.fromkeys(r["b"] for r in rows))
    if not controls:
        return False
    cells = list(dict.fromkeys((r["n"], r["L"], r["w"]) for r in rows))
    plt = pyplot()
    fig, axes = plt.subplots(1, len(controls), figsize=(3.2 + 1.1 * len(cells) * len(controls), 3.6), squeeze=False)
    for ax, b in zip(axes[0], controls):
        mine = {(r["n"], r["L"], r["w"]): r for r in rows if r["b"] == b}
        for x, cell in enumerate(cells):
            r = mine.get(cell)
            if r is None or r["mean"] is None:
                continue
            if r["margin"] is not None:
                ax.fill_between([x - 0.4, x + 0.4], -r["margin"], r["margin"], color="0.85", zorder=0)
            if r["lo"] is not None and r["hi"] is not None:
                ax.plot([x, x], [r["lo"], r["hi"]], color="black", linewidth=0.9)
            if r["lo90"] is not None and r["hi90"] is not None:
                ax.plot([x, x], [r["lo90"], r["hi90"]], color="black", linewidth=3)
            ax.plot([x], [r["mean"]], "o", color="black", markersize=5)
            ax.annotate(f"reach {100 * r['reach_a']:.0f}% / {100 * r['reach_b']:.0f}%", (x, 0.03),
                        xycoords=("data", "axes fraction"), ha="center", fontsize=7, color="0.25")
        ax.axhline(0, color="gray", linewidth=0.8)
        ax.set_xticks(range(len(cells)), [f"n={n}\nL={L}" for n, L, _ in cells], fontsize=8)
        ax.set_xlim(-0.6, len(cells) - 0.4)
        ax.set_title(f"{variant_label(arm)} − {variant_label(b)}", fontsize=9)
        ax.grid(alpha=0.3, axis="y")
    axes[0][0].set_ylabel(OUTCOMES.get(outcome, outcome), fontsize=8)
    fig.suptitle("Where routing could matter: A − B over training seeds (thin 95%, thick 90%, grey ±δ); at the foot "
                 "of each cell, reach past the field A / B", fontsize=8)
    fig.tight_layout()
    save_figure(fig, path, dpi=150, bbox_inches="tight")
    return True


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="cli.py analyze map", **doc_help(__doc__))
    p.add_argument("runs", nargs="+", type=Path, help="long-range study folders, one (n, L, w) cell each")
    p.add_argument("--arm", default="sa", help="the arm every comparison has as A")
    p.add_argument("--outcome", default="logp", choices=sorted(OUTCOMES),
                   help="the outcome mapped (the deciding presets' primary is logp)")
    p.add_argument("--trials", type=int, default=4, help="draws of every layer per reach estimate (a mask that draws)")
    p.add_argument("--out", type=output_folder, default=Path("outputs/map"), help="where map.md, map.csv, map.png go")
    add_overwrite(p)
    return p


def main(argv: list[str] | None = None) -> list[dict]:
    args = build_parser().parse_args(argv)
    if args.trials < 1:
        raise SystemExit(f"error: --trials must be >= 1, got {args.trials}.")
    cells = [run_cell(folder) for folder in args.runs]
    print(f"analyze map: {len(cells)} cell(s), reach through each arm's masks ({args.trials} draws each)", flush=True)
    rows, missing = map_rows(cells, args.arm, args.outcome, args.trials)
    args.out.mkdir(parents=True, exist_ok=True)
    with replacing_files(args.out, "map", args.overwrite) as tmp:
        text = markdown(rows, args.arm, args.outcome, missing)
        write_text(tmp / "map.md", text)
        write_csv(tmp / "map.csv", rows)
        figure(rows, tmp / "map.png", args.arm, args.outcome)
        written = sorted(p.name for p in tmp.iterdir())
    print(text)
    print(f"wrote {', '.join(written)} in {args.out}")
    return rows
