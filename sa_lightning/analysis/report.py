"""``cli.py analyze ...``: run the mechanism checks, write CSV tables and PNG plots."""
from __future__ import annotations

import argparse
import csv
import math
from pathlib import Path

from . import mechanism

COLORS = {"swa": "#4A90D9", "sa": "#E74C3C", "sa_swa": "#2ECC71", "full": "#7F7F7F", "moba": "#F39C12"}


def _write_csv(path: Path, rows: list[dict]) -> None:
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, ax, path: Path, legend_size: int | None = None) -> None:
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=legend_size)
    fig.tight_layout()
    fig.savefig(path, dpi=150)


def run_coverage(args) -> Path:
    rows, curves = [], {}
    for variant in args.variants:
        curve = mechanism.coverage_curve(variant, args.n, args.window, args.depth, trials=args.trials,
                                         sources=args.sources, convention=args.convention, seed=args.seed)
        curves[variant] = curve
        rows += [{"variant": variant, "layers": layer, "coverage": round(float(c), 6)} for layer, c in enumerate(curve)]
        print(f"coverage {variant:>6}: 99% after {mechanism.layers_to_cover(curve)} layers "
              f"(log_w n = {math.log(args.n) / math.log(args.window):.2f}, n/w = {args.n / args.window:.0f})", flush=True)
    _write_csv(args.out / "coverage.csv", rows)
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(5, 3.6))
    for variant, curve in curves.items():
        ax.plot(range(len(curve)), curve.numpy(), label=variant.replace("_", "+").upper(), color=COLORS[variant])
    ax.set(xlabel="layers", ylabel="receptive-field coverage", ylim=(0, 1.02),
           title=f"Coverage vs depth (n={args.n}, w={args.window}, {args.convention})")
    _save(fig, ax, args.out / "coverage.png")
    return args.out / "coverage.csv"


def _per_window(args, measure, report) -> list[dict]:
    """One row per window from ``measure(n, w, trials=, seed=)``, printed as it finishes."""
    rows = []
    for w in args.windows:
        row = measure(args.n, w, trials=args.trials, seed=args.seed)
        report(w, row)
        rows.append({k: (round(v, 8) if isinstance(v, float) else v) for k, v in row.items()})
    return rows


def _window_figure(args, rows: list[dict], name: str, series, legend_size: int | None = None, **axes) -> Path:
    """Write ``<name>.csv`` and a log-log ``<name>.png`` of ``series`` ((column, style, color, label), ...)
    against the window; returns the CSV path."""
    _write_csv(args.out / f"{name}.csv", rows)
    fig, ax = _pyplot().subplots(figsize=(5, 3.6))
    ws = [r["window"] for r in rows]
    for column, style, color, label in series:
        ax.plot(ws, [r[column] for r in rows], style, color=color, label=label)
    ax.set(xscale="log", yscale="log", xlabel="window w", **axes)
    _save(fig, ax, args.out / f"{name}.png", legend_size=legend_size)
    return args.out / f"{name}.csv"


def run_connection(args) -> Path:
    def report(w, row):
        print(f"connection n={args.n} w={w}: measured near {row['measured_near']:.5f} far {row['measured_far']:.5f}  "
              f"exact {row['exact']:.5f}  "
              f"paper {row['paper']:.5f}  w/n {row['approx_w_over_n']:.5f}", flush=True)

    rows = _per_window(args, mechanism.connection_probability, report)
    return _window_figure(args, rows, "connection", [
        ("measured_near", "o", COLORS["sa"], "measured, |i−j|=1"),
        ("measured_far", "x", COLORS["swa"], "measured, |i−j|=n/2"),
        ("exact", "-", "black", "exact (2⌈w/2⌉−2)/(n−1)"),
        ("paper", "--", "gray", "paper (w−1)/(n−1)"),
    ], ylabel="P[pair shares a window]", title=f"SA connection probability (n={args.n})")


def run_variance(args) -> Path:
    def report(w, row):
        print(f"variance n={args.n} w={w}: bias {row['bias']:.4f}  variance {row['variance']:.4f}  "
              f"sampling {row['sampling_variance']:.4f}  paper bound {row['paper_bound']:.4f}", flush=True)

    rows = _per_window(args, mechanism.uniform_attention_moments, report)
    return _window_figure(args, rows, "variance", [
        ("variance", "o-", COLORS["sa"], "SA variance (measured)"),
        ("sampling_variance", "--", "black", "exact sampling variance"),
        ("paper_bound", ":", "gray", "σ²/w bound"),
        ("bias", "s-", COLORS["swa"], "|bias| vs uniform full"),
    ], legend_size=8, title=f"SA at infinite temperature (n={args.n})")


DEFAULT_TRIALS = {"coverage": 8, "connection": 200, "variance": 256}
RUNNERS = {"coverage": run_coverage, "connection": run_connection, "variance": run_variance}


def build_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    parser = parser or argparse.ArgumentParser(prog="cli.py analyze")
    parser.add_argument("what", choices=[*RUNNERS, "all", "attention-maps"],
                        help="which check to run (attention-maps takes its own flags: --ckpt, --layer, ...)")
    parser.add_argument("--n", type=int, default=2048, help="sequence length (Figure 2 uses 2048)")
    parser.add_argument("--window", type=int, default=32, help="window for coverage (Figure 2 uses 32)")
    parser.add_argument("--windows", type=int, nargs="+", default=[4, 8, 16, 32, 64, 128, 256],
                        help="windows for connection and variance")
    parser.add_argument("--depth", type=int, default=72, help="layers to grow the receptive field")
    parser.add_argument("--variants", nargs="+", default=["sa", "swa", "sa_swa"], choices=sorted(COLORS))
    parser.add_argument("--convention", choices=mechanism.CONVENTIONS, default="theory",
                        help="theory: Appendix A's circular window; causal: the masks the models run")
    parser.add_argument("--trials", type=int, default=None,
                        help="Monte Carlo draws (default: coverage 8, connection 200, variance 256)")
    parser.add_argument("--sources", type=int, default=64, help="tokens tracked per coverage draw")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("outputs/analysis"))
    return parser


def main(argv: list[str] | None = None) -> None:
    if argv and argv[0] == "attention-maps":
        from .attention_maps import main as maps_main

        maps_main(argv[1:])
        return
    args = build_parser().parse_args(argv)
    for name, value in (("--n", args.n), ("--window", args.window), ("--depth", args.depth),
                        ("--trials", 1 if args.trials is None else args.trials), ("--sources", args.sources), *(("--windows", w) for w in args.windows)):
        if value < 1:
            raise SystemExit(f"error: {name} must be >= 1, got {value}.")
    args.out.mkdir(parents=True, exist_ok=True)
    chosen = args.trials
    for name in RUNNERS if args.what == "all" else [args.what]:
        args.trials = DEFAULT_TRIALS[name] if chosen is None else chosen
        path = RUNNERS[name](args)
        print(f"wrote {path} and {path.with_suffix('.png')}")
