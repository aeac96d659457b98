"""``cli.py bench attention``: forward+backward latency and peak memory of every variant over n.

The protocol is the paper's (§4.3, Table 2):
- ``full_window`` is full attention as the paper times it: the SWA kernel and backend with w = n. ``full``
  is PyTorch's fused SDPA beside it.
- Each n runs in a process of its own (``--same-process`` turns that off), so that compilation caches
  and allocator state of one length do not leak into the next.
- sigma and sigma^-1 are drawn and inverted before the clock starts, one fresh pair per call, and the
  kernels take both as index tensors.
Within a process the variants run interleaved in each repeat, so that their ratios share the machine's
state. Writes a CSV, a markdown table (the paper's columns first, then every measure) and a PNG
(Figure 2, right).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

import torch

from ..attention import VARIANTS, AttentionSpec, get_variant, invert_permutation, variant_label
from ..attention.variants import FULL, MOBA, SA, SA_SWA, SWA
from ..utils.atomic import add_overwrite, output_folder, replacing_files, write_text
from ..utils.report import head, number, power_of_two_ticks, pyplot, row, save_figure, spread
from ..utils.tables import write_csv
from ..utils.argtypes import doc_help, preset_help
from .machine import describe, positive_int, sync
from .memory import peak_bytes

PRESETS = {
    # Small enough for a 2-core CPU in under three minutes.
    "cpu": dict(batch=1, heads=4, kv_heads=4, dim=64, window=256, lengths=[1024, 2048, 4096, 8192, 16384],
                dtype="float32", device="cpu", repeats=3),
    # The paper's Table 2 setting (A100 in the paper): B=16, H=16, d=64, bf16.
    "paper": dict(batch=16, heads=16, kv_heads=16, dim=64, window=256, lengths=[2048, 4096, 8192, 16384, 32768],
                  dtype="bfloat16", device="cuda", repeats=10),
}
#: the benchmark's rows: the registry's variants and its own names (``full_window``: SWA with w = n)
BENCH_VARIANTS = (FULL.name, "full_window", SWA.name, SA.name, SA_SWA.name, MOBA.name)
#: bench-only names: which registry variant each runs, and with what
ALIASES = {"full_window": SWA.name, "sa_flex": SA.name}
#: how the figures draw the bench-only names (colour, marker, label); the registry's variants draw their own
ALIAS_STYLES = {"full_window": ("#333333", "P", "Full (w=n)"), "sa_flex": ("#9B59B6", "X", "SA (flex fwd)")}


def style(name: str) -> tuple[str, str, str]:
    """(colour, marker, label) of a variant or a bench-only name."""
    if name in ALIAS_STYLES:
        return ALIAS_STYLES[name]
    variant = get_variant(name)
    return variant.color, variant.marker, variant_label(name)
#: the CPU dense path of a band covering the row keeps about this many (B, H, n, n) float32 tensors live
_DENSE_LIVE = 4


class Case:
    """One (variant, n) cell: fixed inputs and, for a variant that draws (SA's sigma, with its inverse; the
    random control's hash seeds), a fresh draw per call, as in training, made ahead of time by ``draw``."""

    def __init__(self, variant: str, n: int, args, device, dtype):
        self.variant, self.n, self.device = variant, n, device
        self.spec = self.spec_of(variant, n, args)
        self.fn = get_variant(self.spec.variant)
        g = torch.Generator().manual_seed(n)
        shape = lambda h: (args.batch, h, n, args.dim)  # noqa: E731
        self.q = torch.randn(shape(args.heads), generator=g).to(device, dtype)
        self.k = torch.randn(shape(args.kv_heads), generator=g).to(device, dtype)
        self.v = torch.randn(shape(args.kv_heads), generator=g).to(device, dtype)
        self.backward = not args.forward_only and (variant != "sa_flex" or device.type == "cuda")
        for t in (self.q, self.k, self.v):
            t.requires_grad_(self.backward)
        self.gen = torch.Generator(device="cpu").manual_seed(0)
        self.pairs: list[tuple] = []

    @staticmethod
    def spec_of(variant: str, n: int, args) -> AttentionSpec:
        """The attention spec ``variant`` runs at length ``n`` (``full_window``: the SWA kernel with w = n)."""
        window = n if variant == "full_window" else args.window
        return AttentionSpec(ALIASES.get(variant, variant), window=window,
                             block_size=max(1, args.window // args.moba_top_k), top_k=args.moba_top_k,
                             backend="flex" if variant == "sa_flex" else args.backend)

    def draw(self, calls: int) -> None:
        """Precompute the draws on the device for the next ``calls`` calls, outside any timing."""
        if self.fn.draws:
            draws = [self.fn.draw(self.spec, self.n, None, self.gen, self.device) for _ in range(calls)]
            self.pairs = [(p, invert_permutation(p) if self.fn.uses_permutation else None) for p in draws]
            sync(self.device)

    def __call__(self):
        perm, inv = self.pairs.pop() if self.pairs else (None, None)
        if self.fn.draws and perm is None:
            raise RuntimeError("Case.draw() must precompute the draws before the case is called.")
        with torch.set_grad_enabled(self.backward):
            outs = self.fn(self.q, self.k, self.v, self.spec, perm, None, inv)
            if self.backward:
                sum(o.float().sum() for o in outs).backward()
                self.q.grad = self.k.grad = self.v.grad = None

    def timed(self) -> float:
        sync(self.device)
        start = time.perf_counter()
        self()
        sync(self.device)
        return time.perf_counter() - start


def _available_bytes() -> int:
    try:
        with open("/proc/meminfo") as fh:
            return next(int(line.split()[1]) * 1024 for line in fh if line.startswith("MemAvailable:"))
    except (OSError, StopIteration):
        return 1 << 62


def _skip_reason(variant: str, n: int, args, device) -> str | None:
    """Why a cell cannot run here, before it is tried: full_window's CPU path holds (B, H, n, n) scores."""
    if variant != "full_window" or device.type != "cpu":
        return None
    need = _DENSE_LIVE * args.batch * args.heads * n * n * 4
    if need > 0.6 * _available_bytes():
        return f"needs about {need / 2**30:.0f} GiB, more than 60% of this machine's free memory"
    return None


def run_length(n: int, args, device, dtype) -> list[dict]:
    """Time every variant at one n, interleaved; a cell that does not fit is recorded, not fatal."""
    skipped = {v: _skip_reason(v, n, args, device) for v in args.variants}
    cases = [Case(v, n, args, device, dtype) for v in args.variants if not skipped[v]]
    for case in cases:  # warm-up: compilation, allocator growth
        case.draw(1)
        case()
    for case in cases:
        case.draw(args.repeats + (0 if args.no_memory else 1))
    times = {c.variant: [] for c in cases}
    for _ in range(args.repeats):
        for case in cases:
            times[case.variant].append(case.timed())
    rows = []
    for variant in args.variants:
        case = next((c for c in cases if c.variant == variant), None)
        if case is None:
            rows.append({"n": n, "variant": variant, "ms": math.nan, "peak_mib": math.nan, "note": skipped[variant]})
            continue
        mem = peak_bytes(case, device) if not args.no_memory else 0
        rows.append({"n": n, "variant": variant, "ms": statistics.median(times[variant]) * 1e3,
                     "peak_mib": mem / 2**20, "note": ""})
    line = "  ".join(f"{r['variant']} {r['ms']:.1f} ms" if not r["note"] else f"{r['variant']} skipped"
                     for r in rows)
    print(f"n={n:>6}: {line}", flush=True)
    return rows


def _child_argv(argv: list[str], n: int, result: str) -> list[str]:
    """This command's own arguments for one length (a later ``--lengths`` overrides the earlier one)."""
    return [sys.executable, "-m", "sa_lightning.bench.attention", *argv, "--lengths", str(n), "--same-process",
            "--child-result", result]


def run(args, argv: list[str] | None = None) -> list[dict]:
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("error: --device cuda was asked for (the paper preset needs a GPU) but no CUDA GPU is visible.")
    rows = []
    for n in args.lengths:
        if args.same_process:
            rows += run_length(n, args, device, dtype)
            continue
        with tempfile.TemporaryDirectory() as tmp:
            result = os.path.join(tmp, "rows.json")
            proc = subprocess.run(_child_argv(argv or [], n, result))
            if proc.returncode == 0:
                rows += json.loads(Path(result).read_text())
            else:  # killed (out of memory) or failed: the other lengths still run
                why = f"its process exited with {proc.returncode}"
                print(f"n={n:>6}: {why}", flush=True)
                rows += [{"n": n, "variant": v, "ms": math.nan, "peak_mib": math.nan, "note": why} for v in args.variants]
    _add_ratios(rows)
    return rows


def _add_ratios(rows):
    by_n = {}
    for r in rows:
        by_n.setdefault(r["n"], {})[r["variant"]] = r
    for cell in by_n.values():
        for r in cell.values():
            for ref in (SWA.name, FULL.name, "full_window"):
                r[f"x_{ref}"] = r["ms"] / cell[ref]["ms"] if ref in cell else math.nan
            swa = cell.get(SWA.name)
            r[f"mem_x_{SWA.name}"] = r["peak_mib"] / swa["peak_mib"] if swa and swa["peak_mib"] else math.nan


def paper_table(rows, variants) -> str:
    """Table 2's layout: one row per n, ms per variant, then each variant's speed-up against full attention
    (``full_window`` when it ran, as in the paper; else SDPA)."""
    by_n: dict[int, dict] = {}
    for r in rows:
        by_n.setdefault(r["n"], {})[r["variant"]] = r
    ref = "full_window" if "full_window" in variants else FULL.name if FULL.name in variants else None
    others = [v for v in variants if v not in (FULL.name, "full_window")] if ref else []
    lines = head(["n", *(f"{v} ms" for v in variants), *(f"{v} speed-up" for v in others)], "---:")
    for n, cell in by_n.items():
        ms = [number(cell[v]["ms"], ".1f") for v in variants]
        ups = [number(cell[ref]["ms"] / cell[v]["ms"], ".1f") for v in others]
        ups = [u if u == "–" else u + "×" for u in ups]
        lines.append(row([n, *ms, *ups]))
    note = f"Speed-up is {ref}'s time over the variant's." if ref else ""
    return "\n".join(lines) + ("\n\n" + note if note else "") + "\n"


def markdown(rows, args) -> str:
    intro = (f"Measured {date.today().isoformat()} on {describe(args.device)}; "
             f"B={args.batch}, H={args.heads}, Hkv={args.kv_heads}, d={args.dim}, w={args.window}, {args.dtype}, "
             f"{'forward only' if args.forward_only else 'forward+backward'}, median of {args.repeats} interleaved repeats, "
             f"{'all lengths in one process' if args.same_process else 'each length in its own process'}; sigma and "
             f"sigma^-1 precomputed outside the timed region. full = SDPA; full_window = the SWA kernel with w = n. "
             f"MoBA: c={max(1, args.window // args.moba_top_k)}, k={args.moba_top_k}. sa_flex is forward only on CPU.\n\n")
    lines = head(["n", "variant", "ms", "× SWA", "× full", "× full_window", "peak MiB", "mem × SWA", "note"],
                 ["---:", "---", "---:", "---:", "---:", "---:", "---:", "---:", "---"])
    for r in rows:
        lines.append(row([r["n"], r["variant"], number(r["ms"], ".1f"), number(r["x_swa"], ".2f"),
                          number(r["x_full"], ".3f"), number(r["x_full_window"], ".3f"), number(r["peak_mib"], ".1f"),
                          number(r["mem_x_swa"], ".2f"), r["note"]]))
    return intro + paper_table(rows, args.variants) + "\n" + "\n".join(lines) + "\n"


#: how far apart (in octaves of n) the variants' markers sit at each length, so that equal values (SA's and
#: SWA's peak memory, full attention's and MoBA's time at 16k) show side by side, not one under the other
DODGE = 0.3


def plot(rows, path: Path, args) -> None:
    """``draw``'s figure, saved to ``path``."""
    save_figure(draw(rows, args), path, dpi=150, bbox_inches="tight")


def draw(rows, args):
    """Latency and (unless ``--no-memory``) peak memory against n, log-log. Each variant has its colour and
    marker (``utils.report``), the full-attention references hollow; at each n the variants' markers are
    nudged a little apart along n so that equal values show side by side; the ticks are the measured lengths
    and one legend sits below the panels, covering none of them. Returns the matplotlib figure."""
    plt = pyplot()
    panels = [("ms", f"ms ({'forward only' if args.forward_only else 'forward+backward'})", f"Latency, w={args.window}")]
    if not args.no_memory:
        panels.append(("peak_mib", "peak memory (MiB)", "Peak memory"))
    fig, axes = plt.subplots(1, len(panels), figsize=(4.6 * len(panels), 3.6), squeeze=False)
    drawn = [v for v in args.variants if any(r["variant"] == v and not math.isnan(r["ms"]) for r in rows)]
    for ax, (key, ylabel, title) in zip(axes[0], panels):
        for variant, dodge in zip(drawn, spread(len(drawn), DODGE)):
            pts = [r for r in rows if r["variant"] == variant and not math.isnan(r[key])]
            if not pts:
                continue
            reference = variant == "full_window" or variant in VARIANTS and not VARIANTS[variant].sparse
            color, marker, label = style(variant)
            ax.plot([r["n"] * dodge for r in pts], [r[key] for r in pts], "-", marker=marker,
                    color=color, markerfacecolor="white" if reference else color,
                    markersize=5.5, markeredgewidth=1.2, linewidth=1.4,
                    label=f"{label} (SDPA)" if variant in VARIANTS and not VARIANTS[variant].sparse else label)
        ax.set(xscale="log", yscale="log", xlabel="sequence length n", ylabel=ylabel, title=title)
        power_of_two_ticks(ax, [r["n"] for r in rows])
        ax.grid(alpha=0.3, which="both")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    # in a strip kept free below the panels: outside both, inside the image however it is saved
    fig.legend(handles, labels, loc="lower center", bbox_to_anchor=(0.5, 0.0), ncol=min(len(labels), 6),
               fontsize=8, frameon=False)
    return fig


def build_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    parser = parser or argparse.ArgumentParser(prog="cli.py bench attention", **doc_help(__doc__))
    parser.add_argument("--preset", choices=sorted(PRESETS), default="cpu",
                        help="the sizes below at once: cpu (a 2-core CPU in under three minutes) or paper (Table 2's "
                             "setting, on a GPU); a flag given wins over its preset")
    for flag, key, text, kind in (
            ("--batch", "batch", "sequences per call", positive_int),
            ("--heads", "heads", "query heads", positive_int),
            ("--kv-heads", "kv_heads", "key and value heads (fewer than --heads: GQA)", positive_int),
            ("--dim", "dim", "head dimension", positive_int),
            ("--window", "window", "the window w of the windowed variants", positive_int),
            ("--dtype", "dtype", "the tensors' dtype", None),
            ("--device", "device", "where to run (cpu, cuda, cuda:1)", None),
            ("--repeats", "repeats", "timed repeats per variant and length; the table shows their median",
             positive_int)):
        parser.add_argument(flag, type=kind, help=preset_help(text, PRESETS, key),
                            **({"choices": ["float32", "bfloat16", "float16"]} if key == "dtype" else {}))
    parser.add_argument("--lengths", type=positive_int, nargs="+",
                        help=preset_help("sequence lengths n", PRESETS, "lengths"))
    parser.add_argument("--variants", nargs="+", default=list(BENCH_VARIANTS), choices=[*VARIANTS, *ALIASES],
                        metavar="VARIANT",
                        help=f"any registered variant ({', '.join(VARIANTS)}) or a bench-only name "
                             f"({', '.join(ALIASES)}): full is SDPA; full_window is the SWA kernel and backend with "
                             "w = n (the paper's full)")
    parser.add_argument("--moba-top-k", type=positive_int, default=2, help="MoBA's k; its block is window // k")
    parser.add_argument("--backend", default="auto", help="attention backend for the windowed variants (auto: the "
                        "variant's own for the device; dense: the n x n masked path, e.g. against the random "
                        "control's gather)")
    parser.add_argument("--no-memory", action="store_true", help="skip the peak-memory pass")
    parser.add_argument("--forward-only", action="store_true", help="time the forward pass alone")
    parser.add_argument("--same-process", action="store_true",
                        help="run every length in this process (default: one process per length, as in the paper)")
    parser.add_argument("--child-result", help=argparse.SUPPRESS)
    parser.add_argument("--out", type=output_folder, default=Path("outputs/bench"),
                        help="the folder of the CSV, the markdown table and the PNG")
    add_overwrite(parser)
    return parser


def check_variants(args) -> None:
    """Every variant's attention spec at ``--window`` (``full_window``'s is w = n), in this process before any length's
    child starts: a control below its least window is one sentence naming it (it failed in each child, whose
    traceback the parent followed with "number sections must be larger than 0")."""
    for variant in args.variants:
        name = ALIASES.get(variant, variant)
        least = get_variant(name).min_window if get_variant(name).windowed else 1
        if variant != "full_window" and args.window < least:
            raise ValueError(f"--variants {variant} needs --window >= {least} (it reads SA's 2*ceil(w/2) - 2 other "
                             f"keys), got --window {args.window}; raise --window or leave {variant} out of --variants.")
        Case.spec_of(variant, min(args.lengths), args)  # the spec's other checks (a backend it cannot take, ...)


def main(argv: list[str] | None = None) -> list[dict]:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    for key, value in PRESETS[args.preset].items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.heads % args.kv_heads:
        raise SystemExit(f"error: --heads {args.heads} must be divisible by --kv-heads {args.kv_heads}.")
    check_variants(args)
    if args.child_result:  # one length for the parent process: rows only
        rows = run(args)
        write_text(Path(args.child_result), json.dumps(rows))
        return rows
    args.out.mkdir(parents=True, exist_ok=True)
    rows = run(args, argv)
    if rows and all(r["ms"] != r["ms"] for r in rows):  # every length's process failed: nothing to tabulate
        raise SystemExit(f"error: every length's process failed ({rows[0]['note']}; its own error is printed above, "
                         "e.g. `No module named sa_lightning` where the package is not installed for this Python); "
                         "nothing was written.")
    name = f"attention_{args.preset}{'_fwd' if args.forward_only else ''}"
    table = markdown(rows, args)
    with replacing_files(args.out, "benchmark", args.overwrite) as tmp:  # the three together, or none
        write_csv(tmp / f"{name}.csv", rows)
        write_text(tmp / f"{name}.md", table)
        plot(rows, tmp / f"{name}.png", args)
    stem = args.out / name
    print("\n" + table)
    print(f"wrote {stem}.csv, {stem}.md and {stem}.png")
    return rows


if __name__ == "__main__":  # the per-length child process
    from ..utils.cpu_allocator import tune_cpu_allocator

    tune_cpu_allocator()
    main()
