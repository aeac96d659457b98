"""``cli.py analyze CHECK``: run the mechanism checks of the paper's theory, write CSV tables and PNG plots.

    coverage      Figure 2 left: the share of the sequence that reaches a token, layer by layer (SWA, SA, SA+SWA)
    reach         what each mask carries to the last query through --layers layers, distance by distance
    connection    the chance that two tokens connect in one layer, against Appendix A's formula
    variance      the spread of that chance over permutations
    connectome    the graph of --layers stacked layers (its shortest paths)
    spectrum      that graph's singular values
    small-world   its clustering and path length against a random graph's
    all           every check above
    attention-maps, gates   read a checkpoint (--ckpt) and take their own flags: `analyze gates --help`
    map           the map of where routing could matter, from finished long-range runs: `analyze map --help`

    python cli.py analyze coverage --out outputs/analysis
    python cli.py analyze reach --n 128 --window 16 --variants swa sa random strided strided_local

Each check's files (its CSVs and PNG) are written in a hidden folder in ``--out`` and moved into place together
(``utils.atomic.replacing_files``): a failure while they are written leaves that check's previous files whole."""
from __future__ import annotations

import argparse
import math
from pathlib import Path

import numpy as np

from ..attention import get_variant, variant_label
from ..attention.variants import SA, SA_BUCKET, SWA
from ..utils.argtypes import doc_help
from ..utils.atomic import add_overwrite, output_folder, replacing_files
from ..utils.report import power_of_two_ticks, pyplot, save_figure, spread
from ..utils.progress import Heartbeat
from ..utils.tables import write_csv
from . import graphs, mechanism

#: seconds between two progress lines at most while a check runs (``utils.progress.Heartbeat``)
PROGRESS_EVERY = 30.0


def _save(fig, ax, path: Path, legend_size: int | None = None) -> None:
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=legend_size)
    fig.tight_layout()
    save_figure(fig, path, dpi=150)


def run_coverage(args) -> Path:
    convention = args.convention or "theory"
    rows, curves = [], {}
    for variant in args.variants:
        curve = mechanism.coverage_curve(variant, args.n, args.window, args.depth, trials=args.trials,
                                         sources=args.sources, convention=convention, seed=args.seed,
                                         progress=lambda line: print(line, flush=True))
        curves[variant] = curve
        rows += [{"variant": variant, "layers": layer, "coverage": round(float(c), 6)} for layer, c in enumerate(curve)]
        print(f"coverage {variant:>6}: 99% after {mechanism.layers_to_cover(curve)} layers "
              f"(log_w n = {math.log(args.n) / math.log(args.window):.2f}, n/w = {args.n / args.window:.0f})", flush=True)
    write_csv(args.out / "coverage.csv", rows)
    fig = draw_coverage(curves, f"Coverage vs depth (n={args.n}, w={args.window}, {convention})")
    save_figure(fig, args.out / "coverage.png", dpi=150, bbox_inches="tight")
    return args.out / "coverage.csv"


def run_reach(args) -> Path:
    """What each variant's own mask carries to the last query through ``--layers`` layers, distance by distance: the
    check a control passes before it stands against SA (a mask that cannot reach a task's distances cannot win
    there). ``reach.csv`` and ``reach.png`` (the chance by distance, SWA's field L·(w − 1) dashed)."""
    from ..attention import get_variant
    from ..utils.report import pyplot

    field = args.layers * (args.window - 1)
    rows, curves = [], {}
    for variant in args.variants:
        chance = mechanism.reach_by_distance(variant, args.n, args.window, args.layers, trials=args.trials,
                                             seed=args.seed)
        curves[variant] = chance
        rows += [{"variant": variant, "layers": args.layers, "distance": d, "chance": round(float(c), 6)}
                 for d, c in enumerate(chance.tolist())]
        if field + 1 < args.n:
            print(f"reach {variant:>14}: {100 * float(chance[field + 1:].mean()):.1f}% of the distances past SWA's "
                  f"field ({field}) reached in {args.layers} layers", flush=True)
        else:  # the field covers the whole row: nothing to average (it printed "nan%")
            print(f"reach {variant:>14}: no distance past SWA's field ({field}) in a row of {args.n} tokens (the "
                  f"farthest is {args.n - 1}); --n above {field + 1} measures reach past it", flush=True)
    write_csv(args.out / "reach.csv", rows)
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    for i, (variant, chance) in enumerate(curves.items()):
        v = get_variant(variant)
        ax.plot(range(args.n), chance.numpy() + 0.012 * i, color=v.color, marker=v.marker, markevery=max(1, args.n // 16),
                lw=1, ms=4, label=v.label)  # offset a hair apart, so that equal curves stay visible
    ax.axvline(field, ls="--", color="grey", lw=1, label=f"SWA's field L·(w−1) = {field}")
    ax.set(xlabel="key–query distance", ylabel=f"chance the key reaches the query in {args.layers} layers",
           ylim=(-0.03, 1.1), title=f"Reach of each mask (n={args.n}, w={args.window}, L={args.layers}, causal; "
                                    "curves offset 0.012 apart)")
    _save(fig, ax, args.out / "reach.png", legend_size=7)
    return args.out / "reach.csv"


#: how far apart (in octaves of depth) the variants' markers sit at one depth, so that equal coverages (every
#: variant at 1.0, SA and SA+SWA on their first layers) show side by side, not one under the other
COVERAGE_DODGE = 0.2
#: the depths that get a marker: every layer up to 8, then about four a doubling (the log axis crowds them)
COVERAGE_MARKS = (*range(1, 9), 10, 12, 14, 16, 20, 24, 28, 32, 40, 48, 56, 64, 80, 96, 112, 128)


def draw_coverage(curves: dict, title: str):
    """Coverage against depth, one line per variant. Depth is on a log axis from layer 1 (layer 0 is each
    token alone, 1/n, the same for every variant; it stays in the CSV): SA covers the sequence in log_w n
    layers, SWA in n/w, and on a linear axis SA's and SA+SWA's rise is squeezed into the first few pixels, one
    curve on the other. Each variant has its marker, nudged a little along depth."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5.4, 3.6))
    depth = max(len(curve) for curve in curves.values()) - 1
    for (variant, curve), dodge in zip(curves.items(), spread(len(curves), COVERAGE_DODGE)):
        layers = list(range(1, len(curve)))
        marks = [i for i, layer in enumerate(layers) if layer in COVERAGE_MARKS or layer == layers[-1]]
        ax.plot([layer * dodge for layer in layers], [float(c) for c in curve[1:]], "-", label=variant_label(variant),
                color=get_variant(variant).color, marker=get_variant(variant).marker, markevery=marks, markersize=5,
                markeredgewidth=1.0, linewidth=1.4)
    ax.set(xscale="log", xlabel="layers (log scale)", ylabel="receptive-field coverage", ylim=(-0.02, 1.05),
           title=title)
    power_of_two_ticks(ax, [2 ** k for k in range(depth.bit_length()) if 2 ** k <= depth])
    ax.grid(alpha=0.3, which="both")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)  # beside the axes, over no curve
    fig.tight_layout()
    return fig


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
    write_csv(args.out / f"{name}.csv", rows)
    fig, ax = pyplot().subplots(figsize=(5, 3.6))
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
              f"paper {row['paper']:.5f}  w/n {row['approx_w_over_n']:.5f}  bucketed SA: measured near "
              f"{row['bucket_measured_near']:.5f} far {row['bucket_measured_far']:.5f} exact {row['bucket_exact']:.5f}",
              flush=True)

    rows = _per_window(args, mechanism.connection_probability, report)
    return _window_figure(args, rows, "connection", [
        ("measured_near", "o", SA.color, "measured, |i−j|=1"),
        ("measured_far", "x", SWA.color, "measured, |i−j|=n/2"),
        ("exact", "-", "black", "exact (2⌈w/2⌉−2)/(n−1)"),
        ("paper", "--", "gray", "paper (w−1)/(n−1)"),
        ("bucket_measured_near", "<", SA_BUCKET.color, "bucketed SA, measured, |i−j|=1"),
        ("bucket_measured_far", "4", SA_BUCKET.color, "bucketed SA, measured, |i−j|=n/2"),
        ("bucket_exact", ":", SA_BUCKET.color, "bucketed SA, exact"),
    ], ylabel="P[pair shares a window]", title=f"SA and bucketed SA: connection probability (n={args.n})")


def run_variance(args) -> Path:
    def report(w, row):
        print(f"variance n={args.n} w={w}: bias {row['bias']:.4f}  variance {row['variance']:.4f}  "
              f"sampling {row['sampling_variance']:.4f}  paper bound {row['paper_bound']:.4f}", flush=True)

    rows = _per_window(args, mechanism.uniform_attention_moments, report)
    return _window_figure(args, rows, "variance", [
        ("variance", "o-", SA.color, "SA variance (measured)"),
        ("sampling_variance", "--", "black", "exact sampling variance"),
        ("paper_bound", ":", "gray", "σ²/w bound"),
        ("bias", "s-", SWA.color, "|bias| vs uniform full"),
    ], legend_size=8, title=f"SA at infinite temperature (n={args.n})")


def _random_span(n: int) -> float:
    """Mean |i - j| / n over all unordered pairs i != j: (n + 1) / (3n)."""
    return (n + 1) / (3 * n)


def run_connectome(args) -> Path:
    """Figure 1b's analogue: the union of an L-layer stack's masks, raw and after Reverse Cuthill-McKee."""
    convention = args.convention or "causal"
    result = graphs.connectome(args.n, args.window, args.layers, seed=args.seed, convention=convention)
    rows = []
    for graph, r in result.items():
        for order in ("raw", "rcm"):
            stats = r[order]
            rows.append({"graph": graph, "order": order, "n": args.n, "window": args.window, "layers": args.layers,
                         "convention": convention, "mean_degree": round(r["mean_degree"], 3),
                         "bandwidth": stats["bandwidth"], "bandwidth_over_n": round(stats["bandwidth"] / args.n, 4),
                         "band_fraction": round(stats["band_fraction"], 4),
                         "mean_span": round(stats["mean_span"], 4),
                         # an Erdos-Renyi graph of the same mean degree: in token order, and after its own RCM
                         "band_fraction_random": round(graphs.band_fraction_random(args.n, args.window), 4),
                         "mean_span_random": round(_random_span(args.n), 4),
                         "bandwidth_random_rcm": r["random_rcm"]["bandwidth"],
                         "band_fraction_random_rcm": round(r["random_rcm"]["band_fraction"], 4)})
        print(f"connectome {graph:>6} ({convention}, {args.layers} layers): RCM bandwidth {r['rcm']['bandwidth']} of "
              f"{args.n - 1}; edges within w of the diagonal {r['raw']['band_fraction']:.3f} raw, "
              f"{r['rcm']['band_fraction']:.3f} after RCM (random graph of equal degree: "
              f"{rows[-1]['band_fraction_random']:.3f} raw, {rows[-1]['band_fraction_random_rcm']:.3f} after RCM)",
              flush=True)
    write_csv(args.out / "connectome.csv", rows)
    plt = pyplot()
    fig, axes = plt.subplots(2, len(result), figsize=(3.4 * len(result), 7.0), squeeze=False)
    for col, (graph, r) in enumerate(result.items()):
        rcm = r["adjacency"].toarray()[r["order"]][:, r["order"]] > 0
        for row, (image, what, stats) in enumerate(((r["mask"], "raw (query × key)", r["raw"]),
                                                   (rcm, "after RCM (undirected)", r["rcm"]))):
            ax = axes[row][col]
            ax.imshow(image, cmap="Greys", interpolation="antialiased", vmin=0, vmax=1)
            ax.set_title(f"{variant_label(graph)}, {what}\n"
                         f"bandwidth {stats['bandwidth']}, in-band {stats['band_fraction']:.2f}", fontsize=9)
            ax.set_xticks([])
            ax.set_yticks([])
    fig.suptitle(f"Attention adjacency, union of {args.layers} layers (n={args.n}, w={args.window}, {convention})",
                 fontsize=10)
    fig.tight_layout()
    save_figure(fig, args.out / "connectome.png", dpi=110)  # n x n noise compresses badly: keep the file small
    return args.out / "connectome.csv"


def _spectrum_rows(args, convention: str) -> tuple[list[dict], list[dict], dict]:
    """(eigenvalue rows, mixing rows, {graph: eigenvalues}) for every graph."""
    eig_rows, mix_rows, spectra = [], [], {}
    causal = convention == "causal"
    lam2 = graphs.circulant_lambda2(args.n, args.window)
    for graph in graphs.GRAPHS:
        ops = graphs.layer_operators(graph, args.n, args.window, args.layers, seed=args.seed, convention=convention)
        values = graphs.operator_eigenvalues(ops[0])
        spectra[graph] = values
        eig_rows += [{"graph": graph, "rank": i, "real": round(float(v.real), 10), "imag": round(float(v.imag), 10)}
                     for i, v in enumerate(values)]
        for row in graphs.mixing_curve(ops, causal):
            row = {"graph": graph, "convention": convention, "n": args.n, "window": args.window, **row,
                   "swa_analytic_sigma2": float("nan") if causal else lam2 ** row["layers"]}
            mix_rows.append({k: (round(v, 8) if isinstance(v, float) else v) for k, v in row.items()})
        last = mix_rows[-1]
        print(f"spectrum {graph:>6} ({convention}): |lambda_2| {abs(values[1]):.6f}, eigenvalue 1 x"
              f"{int(np.isclose(values, 1.0).sum())}; after {args.layers} layers sigma_2 {last['sigma2']:.3g}, "
              f"TV to uniform {last['tv_to_uniform']:.3g}", flush=True)
    return eig_rows, mix_rows, spectra


def run_spectrum(args) -> Path:
    """Appendix A.4: one layer's uniform-attention operator (SA is SWA conjugated by a permutation, so the
    two share a spectrum in the circular convention) and how fast the L-layer product mixes."""
    convention = args.convention or "theory"
    eig_rows, mix_rows, spectra = _spectrum_rows(args, convention)
    gap = np.abs(np.sort(spectra[SA.name].real) - np.sort(spectra[SWA.name].real)).max()
    print(f"spectrum: max |sorted eig(SA) - sorted eig(SWA)| = {gap:.3g} (one layer, {convention}); "
          f"circulant lambda_2 = {graphs.circulant_lambda2(args.n, args.window):.6f}", flush=True)
    write_csv(args.out / "spectrum_eigenvalues.csv", eig_rows)
    write_csv(args.out / "spectrum.csv", mix_rows)
    plt = pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(14, 3.8))
    for graph, values in spectra.items():
        style = "--" if graph == SA.name else "-"
        axes[0].plot(np.arange(len(values)) / len(values), np.sort(values.real)[::-1], style, color=get_variant(graph).color,
                     label=variant_label(graph))
        curve = [r for r in mix_rows if r["graph"] == graph]
        layers = [r["layers"] for r in curve]
        if convention == "theory":
            axes[1].plot(layers, [r["sigma2"] for r in curve], "o-", color=get_variant(graph).color, label=variant_label(graph))
        axes[2].plot(layers, [r["tv_to_uniform"] for r in curve], "o-", color=get_variant(graph).color, label=variant_label(graph))
    axes[0].set(xlabel="eigenvalue rank / n", ylabel="eigenvalue (real part)", title="one layer's operator")
    if convention == "theory":
        layers = [r["layers"] for r in mix_rows if r["graph"] == SWA.name]
        axes[1].plot(layers, [graphs.circulant_lambda2(args.n, args.window) ** L for L in layers], ":", color="black",
                     label="SWA analytic λ₂^L")
        axes[1].set(yscale="log", xlabel="layers L", ylabel="σ₂ of the L-layer product", title="spectral mixing")
    else:
        axes[1].text(0.5, 0.5, "causal operators are triangular:\nno doubly stochastic σ₂", ha="center",
                     va="center", transform=axes[1].transAxes)
        axes[1].set(title="spectral mixing")
    axes[2].set(yscale="log", xlabel="layers L", ylabel="mean TV to uniform attention", title="distance to uniform")
    for ax in axes:
        ax.grid(alpha=0.3, which="both")
        if ax.lines:
            ax.legend(fontsize=8)
    fig.suptitle(f"Uniform-attention mixing operator (n={args.n}, w={args.window}, {convention})", fontsize=10)
    fig.tight_layout()
    save_figure(fig, args.out / "spectrum.png", dpi=150)
    return args.out / "spectrum.csv"


def _ratio(value: float, reference: float) -> float:
    """value / reference, NaN (not drawn) where the reference is 0 or infinite (a graph without edges)."""
    return value / reference if 0 < reference < math.inf else math.nan


def run_small_world(args) -> Path:
    """Clustering and path length of SWA, SA and SA+SWA (one layer and the L-layer union) against an
    Erdos-Renyi graph of the same mean degree."""
    convention = args.convention or "theory"
    rows = graphs.small_world(args.n, args.window, args.layers, seed=args.seed, convention=convention,
                              progress=lambda line: print(line, flush=True))
    write_csv(args.out / "small_world.csv", rows, digits=6)
    plt = pyplot()
    from matplotlib.ticker import NullFormatter, ScalarFormatter

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    for ax, scope in zip(axes, ("layer", "stack")):
        chosen = [r for r in rows if r["scope"] == scope]
        for r in chosen:  # one SA layer is a relabelled SWA layer: the SA marker sits inside SWA's
            marker, size = {SWA.name: ("o", 110), SA.name: ("D", 35)}.get(r["graph"], ("s", 60))
            ax.scatter(_ratio(r["path_length"], r["path_length_random"]),
                       _ratio(r["clustering"], r["clustering_random"]), s=size, marker=marker, color=get_variant(r["graph"]).color,
                       label=f"{variant_label(r['graph'])} (k={r['mean_degree']:.0f}, σ={r['sigma']:.1f})")
        ax.scatter(1, 1, marker="x", color="black", label="random graph, same k")
        ax.set(xscale="log", yscale="log", xlabel="L / L_random (path length)", ylabel="C / C_random (clustering)",
               title="one layer" if scope == "layer" else f"union of {args.layers} layers")
        ax.xaxis.set_major_formatter(ScalarFormatter())
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7)
    fig.suptitle(f"Small world: high C / C_rand with L ≈ L_rand (n={args.n}, w={args.window}, {convention})",
                 fontsize=10)
    fig.tight_layout()
    save_figure(fig, args.out / "small_world.png", dpi=150)
    return args.out / "small_world.csv"


DEFAULT_TRIALS = {"coverage": 8, "connection": 200, "variance": 256, "reach": 16}
RUNNERS = {"coverage": run_coverage, "reach": run_reach, "connection": run_connection, "variance": run_variance,
           "connectome": run_connectome, "spectrum": run_spectrum, "small-world": run_small_world}
#: commands that take their own flags (a checkpoint's, the map's runs)
CHECKPOINT_COMMANDS = ("attention-maps", "gates", "map")
GRAPH_COMMANDS = ("connectome", "spectrum", "small-world")


#: the graph checks' peak memory per n² (dense float64 operators, sparse copies, the connectome's images), measured
#: at n = 1024, --layers 4: 141, 55 and 48 bytes; the others hold ``mechanism.BYTES_PER_ENTRY``
MASK_BYTES = {"connectome": 144, "spectrum": 64, "small-world": 64}


def work(name: str, args) -> tuple[int, int, tuple[str, ...]]:
    """What check ``name`` costs with ``args`` (its ``--trials`` set): the (n, n) mask layers it draws, the dense
    n³ products it takes, and the flags that size them."""
    trials = DEFAULT_TRIALS.get(name, 1) if args.trials is None else args.trials
    each = lambda: sum(trials if get_variant(v).draws else 1 for v in args.variants)  # noqa: E731
    graphs_n = len(graphs.GRAPHS)
    return {"coverage": (each() * args.depth, 0, ("--depth", "--trials", "--variants")),
            "reach": (each() * args.layers, 0, ("--layers", "--trials", "--variants")),
            "connection": (len(args.windows) * trials * 2, 0, ("--trials", "--windows")),
            "variance": (0, 0, ()),  # n × w × d per trial: no (n, n) mask
            "connectome": (graphs_n * args.layers, 0, ("--layers",)),
            "spectrum": (graphs_n * args.layers, graphs_n * (args.layers + 1), ("--layers",)),
            "small-world": (graphs_n * args.layers, 2 * graphs_n, ("--layers",))}[name]


def check_size(args) -> None:
    """Refuse, before any draw, a check whose masks do not fit this machine's memory or whose estimate passes a
    day (``mechanism.check_size``): ``--layers 100000`` ran silently for days."""
    names = list(RUNNERS) if args.what == "all" else [args.what]
    costs = [work(name, args) for name in names]
    draws, cubes = sum(c[0] for c in costs), sum(c[1] for c in costs)
    if not draws and not cubes:
        return
    flags = ["--n", *dict.fromkeys(flag for c in costs for flag in c[2] if flag != "--variants")]
    fix = f"lower {', '.join(flags[:-1])} or {flags[-1]}" if len(flags) > 1 else f"lower {flags[0]}"
    if any("--variants" in c[2] for c in costs):
        fix += ", or name fewer --variants"
    field = args.layers * (args.window - 1)
    note = (f" (and at --layers {args.layers} SWA's field L·(w−1) = {field:,} already passes the row's farthest "
            f"distance, {args.n - 1:,}: no distance lies past it)") if "reach" in names and field >= args.n - 1 else ""
    mechanism.check_size(f"analyze {args.what} at --n {args.n}", args.n, draws, fix, cubes, note,
                         max(MASK_BYTES.get(name, mechanism.BYTES_PER_ENTRY) for name in names), "lower --n")


def build_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    parser = parser or argparse.ArgumentParser(prog="cli.py analyze", **doc_help(__doc__))
    parser.add_argument("what", choices=[*RUNNERS, "all", *CHECKPOINT_COMMANDS],
                        help="which check to run (attention-maps and gates read a checkpoint, map reads finished "
                             "long-range runs; each takes its own flags: `analyze map --help`)")
    parser.add_argument("--n", type=int, default=2048, help="sequence length (Figure 2 uses 2048)")
    parser.add_argument("--window", type=int, default=32,
                        help="window for coverage, connectome, spectrum and small-world (Figure 2 uses 32)")
    parser.add_argument("--windows", type=int, nargs="+", default=[4, 8, 16, 32, 64, 128, 256],
                        help="windows for connection and variance")
    parser.add_argument("--depth", type=int, default=72, help="layers to grow the receptive field")
    parser.add_argument("--layers", type=int, default=4,
                        help="layers in the stack for reach, connectome, spectrum and small-world (one permutation "
                             "each)")
    parser.add_argument("--variants", nargs="+", default=list(graphs.GRAPHS), choices=mechanism.PATTERNED,
                        metavar="VARIANT", help=f"the masks to check, any of {', '.join(mechanism.PATTERNED)}")
    parser.add_argument("--convention", choices=mechanism.CONVENTIONS, default=None,
                        help="theory: Appendix A's circular window; causal: the masks the models run "
                             "(default: causal for connectome, theory for the others)")
    parser.add_argument("--trials", type=int, default=None,
                        help="Monte Carlo draws (default: coverage 8, connection 200, variance 256)")
    parser.add_argument("--sources", type=int, default=64, help="tokens tracked per coverage draw")
    parser.add_argument("--seed", type=int, default=0, help="the seed of the permutations and Monte Carlo draws")
    parser.add_argument("--out", type=output_folder, default=Path("outputs/analysis"),
                        help="the folder of each check's CSV tables and PNG")
    add_overwrite(parser)
    return parser


def main(argv: list[str] | None = None) -> None:
    if argv and argv[0] == "attention-maps":
        from .attention_maps import main as maps_main

        with Heartbeat("analyze attention-maps", PROGRESS_EVERY):
            maps_main(argv[1:])
        return
    if argv and argv[0] == "map":
        from .routing_map import main as map_main

        with Heartbeat("analyze map", PROGRESS_EVERY):
            map_main(argv[1:])
        return
    if argv and argv[0] == "gates":
        from .gates import main as gates_main

        with Heartbeat("analyze gates", PROGRESS_EVERY):
            gates_main(argv[1:])
        return
    args = build_parser().parse_args(argv)
    for name, value in (("--n", args.n), ("--window", args.window), ("--depth", args.depth), ("--layers", args.layers),
                        ("--trials", 1 if args.trials is None else args.trials), ("--sources", args.sources),
                        *(("--windows", w) for w in args.windows)):
        if value < 1:
            raise SystemExit(f"error: {name} must be >= 1, got {value}.")
    if args.what in (*GRAPH_COMMANDS, "all") and args.n < 4:
        raise SystemExit(f"error: --n must be >= 4 for {', '.join(GRAPH_COMMANDS)}, got {args.n}.")
    chosen = args.trials
    check_size(args)  # absurd sizes (--layers 100000, --n 10**6) in one sentence, before any draw
    args.out.mkdir(parents=True, exist_ok=True)
    for name in RUNNERS if args.what == "all" else [args.what]:
        args.trials = DEFAULT_TRIALS.get(name, 1) if chosen is None else chosen
        with replacing_files(args.out, "analysis", args.overwrite) as tmp, \
                Heartbeat(f"analyze {name}", PROGRESS_EVERY):  # the check's CSVs and PNG together; a line every 30 s
            RUNNERS[name](argparse.Namespace(**{**vars(args), "out": tmp}))
            written = sorted(p.name for p in tmp.iterdir())
        print(f"wrote {', '.join(written)} in {args.out}")
