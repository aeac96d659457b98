"""``cli.py sweep``: the paper's training-free window sweeps (§4.2, Tables 4-5, Figures 4-8).

    python cli.py sweep --config configs/sweep/qwen3_8b.yaml [--limit 200] [--out outputs/sweep/qwen3_8b]

One model is loaded once; every cell (mode, window, sink, seed, task) patches its prefill and runs one
task: an lm-eval task, or ``position_ppl_<n>`` (perplexity by token position, ``eval.position``). Each finished cell is written at once to ``<out>/cells/``, and a rerun skips the cells
already there, so a killed sweep resumes where it stopped. At the end: ``results.json``,
``results.csv``, ``table.md`` (rows w_eff x mode, columns the tasks and their average; best in bold
and second underlined within each w_eff) and the plots ``average.png`` (Figure 4) and ``tasks.png``
(Figures 5-8). Every cell also records its budget, the mean keys each query attended (counted by the
patcher from the masks its kernels used), so ``budget.png`` sets score against keys per query, and
``position.png`` draws the perplexity by position of the ``position_ppl_*`` tasks.
"""
from __future__ import annotations

import json
import math
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path

from ..eval.position import context_length, is_position_task
from ..utils.atomic import savefig, write_text
from ..utils.tables import write_csv
from .patcher import PatchSpec

#: the metric each task's column shows (the paper: accuracy; HellaSwag acc_norm; HumanEval pass@1)
METRICS = {"hellaswag": "acc_norm", "arc_challenge": "acc_norm", "humaneval": "pass@1",
           "humaneval_exec": "pass_at_k", "shakespeare_choice": "acc_norm"}
LABELS = {"hellaswag": "Hella.", "mmlu": "MMLU", "arc_challenge": "ARC-C", "boolq": "BoolQ", "lambada_openai": "LMB",
          "arc_easy": "ARC-E", "humaneval": "HuEval", "humaneval_exec": "HuEval", "shakespeare_lastword": "LW",
          "shakespeare_choice": "MC", "passkey_512": "PK-512", "passkey_1k": "PK-1k", "passkey_2k": "PK-2k",
          "passkey_4k": "PK-4k"}
CODE_TASKS = ("humaneval",)


@dataclass
class SweepConfig:
    """Args:
        model: a Hub id, a local folder of a causal LM (``save_pretrained`` output), a ``.gguf`` file, or
            ``smollm2`` once ``python cli.py fetch smollm2`` has placed it (``sa_lightning.models.sources``).
        tokenizer: defaults to the model's.
        dtype: auto | bfloat16 | float16 | float32. device_map: e.g. auto, cuda, cpu.
        tasks: lm-eval task names (the offline ones work without a network).
        modes: any of full, swa, sa, sa_swa, moba; ``full`` is the one baseline row.
        windows: w for swa, sa and sa_swa. moba_block_sizes, moba_top_k: MoBA rows at w_eff = c * k.
        sinks: attention sinks for swa, sa and sa_swa rows (0: the paper's masks; k: the first k tokens of a row
            stay visible to every query, StreamingLLM's sinks).
        seeds: SA permutation seeds; the rows of ``seed_modes`` (default sa and sa_swa) average over them, the
            other modes run the first seed only (their masks draw nothing). limit: documents per task; task_limits
            overrides it per task. presets: named sets of overrides, picked by ``--preset NAME``.
        sa_mode: ``stochastic`` (the paper's §3.3: every input draws its own sigma from the seed, the layer
            and its tokens) or ``deterministic`` (one sigma per seed, layer and length).
        confirm_run_unsafe_code: required for tasks that run model-written code (HumanEval).
        trust_remote_code: let the model's repo run its own code (off unless you opt in).
    """

    model: str
    tokenizer: str | None = None
    dtype: str = "auto"
    device_map: str | None = None
    batch_size: int = 8
    max_length: int | None = None
    tasks: list[str] = field(default_factory=lambda: ["hellaswag", "mmlu", "arc_challenge", "boolq",
                                                       "lambada_openai", "arc_easy"])
    modes: list[str] = field(default_factory=lambda: ["full", "swa", "sa", "moba"])
    windows: list[int] = field(default_factory=lambda: [16, 32, 64, 128, 256, 512])
    moba_block_sizes: list[int] = field(default_factory=lambda: [32, 64, 128, 256])
    moba_top_k: int = 2
    sinks: list[int] = field(default_factory=lambda: [0])
    seeds: list[int] = field(default_factory=lambda: [0])
    seed_modes: list[str] = field(default_factory=lambda: ["sa", "sa_swa"])
    sa_mode: str = "stochastic"
    limit: float | None = None
    task_limits: dict[str, float] | None = None
    presets: dict[str, dict] | None = None
    num_fewshot: int | None = None
    confirm_run_unsafe_code: bool = False
    trust_remote_code: bool = False
    out: str = "outputs/sweep"

    def __post_init__(self):
        for mode in self.modes:
            PatchSpec(mode, 1)  # an unknown mode fails here, with close matches
        for name in ("windows", "moba_block_sizes"):
            for value in getattr(self, name):
                if value < 1:
                    raise ValueError(f"sweep {name} must all be >= 1, got {value}.")
        if self.moba_top_k < 1:
            raise ValueError(f"sweep moba_top_k must be >= 1, got {self.moba_top_k}.")
        if not self.seeds:
            raise ValueError("sweep seeds must name at least one seed.")
        for mode in self.seed_modes:
            PatchSpec(mode, 1)  # a misspelt seed mode fails like a misspelt mode
        for sink in self.sinks:
            PatchSpec("swa", 1, sink=sink)  # a negative or non-integer sink fails here, in one sentence
        PatchSpec("full", sa_mode=self.sa_mode)  # an unknown sa_mode fails here
        unsafe = [t for t in self.tasks if str(t).startswith(CODE_TASKS)]
        if unsafe and not self.confirm_run_unsafe_code:
            raise ValueError(f"task(s) {', '.join(unsafe)} execute model-written code; set "
                             "confirm_run_unsafe_code: true (or --confirm_run_unsafe_code true) to allow it.")


@dataclass(frozen=True)
class Cell:
    mode: str
    w_eff: int | None  # None for full
    seed: int
    task: str
    spec: PatchSpec

    @property
    def sink(self) -> int:
        return self.spec.sink

    @property
    def key(self) -> str:
        fixed = "_det" if self.spec.sa_mode == "deterministic" and self.mode in ("sa", "sa_swa") else ""
        sink = f"_k{self.sink}" if self.sink else ""  # sink 0 keeps the names cells had before sinks existed
        return f"{self.mode}_w{self.w_eff or 'all'}{sink}_s{self.seed}{fixed}_{self.task}"


def cells(cfg: SweepConfig) -> list[Cell]:
    out = []
    for mode in cfg.modes:
        if mode == "full":
            settings = [(None, PatchSpec("full"))]
        elif mode == "moba":
            settings = [(c * cfg.moba_top_k, PatchSpec("moba", None, c, cfg.moba_top_k)) for c in cfg.moba_block_sizes]
        else:
            settings = [(w, PatchSpec(mode, w, sink=k)) for w in cfg.windows for k in cfg.sinks]
        seeds = cfg.seeds if mode in cfg.seed_modes else cfg.seeds[:1]
        for w_eff, spec in settings:
            for seed in seeds:
                for task in cfg.tasks:
                    out.append(Cell(mode, w_eff, seed, task, replace(spec, seed=seed, sa_mode=cfg.sa_mode)))
    return out


def metric_of(task: str, metrics: dict[str, float]) -> tuple[str, float | None]:
    if is_position_task(task):
        return "ppl", metrics.get("ppl")
    name = METRICS.get(task) or next((m for m in ("acc", "acc_norm", "exact_match", "pass@1") if m in metrics), None)
    return name, (metrics.get(name) if name else None)


def lower_is_better(task: str) -> bool:
    return is_position_task(task)


def label_of(task: str) -> str:
    if is_position_task(task):
        n = context_length(task)
        return f"PPL@{n // 1024}k" if n % 1024 == 0 else f"PPL@{n}"
    return LABELS.get(task, task)


def context_of(task: str) -> int | None:
    """The tokens a long-context task puts in one prompt (None: a task of short documents)."""
    from ..eval.offline import CONTEXT_LENGTHS

    return context_length(task) if is_position_task(task) else CONTEXT_LENGTHS.get(task)


def load_model(cfg: SweepConfig, source=None):
    """The Hugging Face model and tokenizer through ``models.sources`` (Hub id, folder or GGUF file); clear
    sentences for a missing model and for remote code."""
    from ..models.sources import load_causal_lm, load_tokenizer, resolve

    source = source or resolve(cfg.model)
    try:
        model = load_causal_lm(source, cfg.dtype, cfg.device_map, cfg.trust_remote_code)
        tokenizer = load_tokenizer(source, cfg.tokenizer, cfg.trust_remote_code)
    except (OSError, ValueError) as err:
        raise _load_error(cfg, err) from None
    return model, tokenizer


def _load_error(cfg: SweepConfig, err: Exception) -> ValueError:
    text = str(err)
    if "trust_remote_code" in text:
        return ValueError(f"model {cfg.model!r} ships its own code; it runs only if you opt in with "
                          "trust_remote_code: true.")
    return ValueError(f"model {cfg.model!r} cannot be loaded: it is neither a local model folder, a GGUF file nor a "
                      f"reachable Hub repo ({text.splitlines()[0][:200] if text else type(err).__name__}).")


def check_before_loading(cfg: SweepConfig, source, tasks: list[str]) -> None:
    """What can be refused from the model's config alone (cheap), before its weights load: a task context
    or a MoBA window longer than ``max_position_embeddings``."""
    from ..models.sources import load_config

    try:
        config = load_config(source, cfg.trust_remote_code)
    except (OSError, ValueError) as err:
        raise _load_error(cfg, err) from None
    limit = getattr(config, "max_position_embeddings", None)
    if not limit:
        return
    too_long = [f"{t} ({context_of(t)} tokens)" for t in tasks if (context_of(t) or 0) > limit]
    if too_long:
        raise ValueError(f"task(s) {', '.join(too_long)} need a longer context than the model's "
                         f"max_position_embeddings={limit}; drop them from tasks.")
    too_wide = sorted({c * cfg.moba_top_k for c in cfg.moba_block_sizes if c * cfg.moba_top_k > limit}) \
        if "moba" in cfg.modes else []
    if too_wide:
        raise ValueError(f"MoBA's block_size * top_k = {too_wide} does not fit the model's "
                         f"max_position_embeddings={limit}; drop those moba_block_sizes.")


def _done(path: Path, cell: Cell) -> bool:
    """A cell file counts as done only if it was run with this cell's exact spec (a file from before a
    change of spec, such as sa_mode, is run again rather than mixed into the table)."""
    if not path.exists():
        return False
    try:
        stored = json.loads(path.read_text()).get("spec")
    except ValueError:
        return False
    # a field added to PatchSpec later (sink) reads as its default in cells written before it existed
    defaults = {f.name: f.default for f in fields(PatchSpec)}
    return isinstance(stored, dict) and {**defaults, **stored} == asdict(cell.spec)


def run_cell(lm, cell: Cell, cfg: SweepConfig, metadata: dict) -> tuple[dict, float | None]:
    """Run one cell on the patched model; returns its metrics and the keys each query attended."""
    from ..eval.harness import run_tasks
    from ..eval.position import position_perplexity
    from .patcher import counting_keys

    limit = (cfg.task_limits or {}).get(cell.task, cfg.limit)
    with counting_keys() as counted:
        if is_position_task(cell.task):
            metrics = position_perplexity(lm.model, lm.tokenizer, context_length(cell.task), limit=limit)
        else:
            results = run_tasks(lm, [cell.task], limit=limit, seed=1234, num_fewshot=cfg.num_fewshot,
                                confirm_run_unsafe_code=cfg.confirm_run_unsafe_code, metadata=metadata)
            metrics = results.get(cell.task, {})
    budget = counted["keys"] / counted["queries"] if counted["queries"] else None
    return metrics, budget


def run(cfg: SweepConfig) -> dict:
    from ..eval.harness import load_tasks, resolve_tasks
    from ..models.sources import resolve
    from .lm import PatchedHFLM
    from .patcher import patch

    source = resolve(cfg.model)  # a missing or unpatchable GGUF fails here, in one sentence
    # lm-eval names (task sets such as table1 expand); position_ppl_* is ours and stays as it is
    cfg.tasks = [name for t in cfg.tasks for name in ([t] if is_position_task(t) else resolve_tasks([t]))]
    todo = cells(cfg)
    out = Path(cfg.out)
    (out / "cells").mkdir(parents=True, exist_ok=True)
    write_text(out / "config.json", json.dumps(asdict(cfg), indent=2))
    pending = [c for c in todo if not _done(out / "cells" / f"{c.key}.json", c)]
    print(f"sweep: {len(todo)} cells, {len(todo) - len(pending)} already done, {len(pending)} to run", flush=True)
    if pending:
        check_before_loading(cfg, source, cfg.tasks)
        # the pass-key tasks size their prompts in the tokens of this tokenizer (lm-eval hands it to their loader)
        metadata = {"tokenizer": cfg.tokenizer or source.path, **({} if cfg.tokenizer else source.kwargs)}
        lm_tasks = sorted({c.task for c in pending if not is_position_task(c.task)})
        if lm_tasks:
            load_tasks(lm_tasks, metadata=metadata)  # unreachable datasets fail before the model loads
        model, tokenizer = load_model(cfg, source)
        lm = PatchedHFLM(model, tokenizer=tokenizer, batch_size=cfg.batch_size, max_length=cfg.max_length,
                         device=str(model.device))
        for i, cell in enumerate(pending, 1):
            start = time.perf_counter()
            patch(model, cell.spec)
            metrics, budget = run_cell(lm, cell, cfg, metadata)
            record = {"mode": cell.mode, "w_eff": cell.w_eff, "sink": cell.sink, "seed": cell.seed,
                      "task": cell.task, "spec": asdict(cell.spec), "metrics": metrics, "keys_per_query": budget,
                      "seconds": time.perf_counter() - start}
            write_text(out / "cells" / f"{cell.key}.json", json.dumps(record, indent=2))
            name, value = metric_of(cell.task, metrics)
            shown = f"{name}={value:.4f}" if value is not None else "no metric"
            kpq = f", {budget:.1f} keys/query" if budget is not None else ""
            sink = f" sink {cell.sink}" if cell.sink else ""
            print(f"[{i}/{len(pending)}] {cell.mode:>6} w_eff={cell.w_eff or 'all':>4}{sink} seed {cell.seed} "
                  f"{cell.task}: {shown}{kpq} ({record['seconds']:.1f}s)", flush=True)
    return report(cfg, out)


def collect(cfg: SweepConfig, out: Path) -> list[dict]:
    """One row per (mode, w_eff, sink): each task's metric averaged over seeds (accuracies in %), ``avg`` the
    mean of the accuracy tasks (perplexities stay out of it), ``kpq`` the keys per query averaged over the
    same accuracy tasks (so ``avg`` and ``kpq`` describe one set of inputs), ``kpq:<task>`` each task's own, and ``pos:<task>`` the perplexity by position of a
    ``position_ppl_*`` task."""
    records = [json.loads((out / "cells" / f"{c.key}.json").read_text()) for c in cells(cfg)
               if (out / "cells" / f"{c.key}.json").exists()]
    rows: dict[tuple, dict] = {}
    for rec in records:
        key = (rec["mode"], rec["w_eff"], rec.get("sink", 0))
        row = rows.setdefault(key, {"mode": key[0], "w_eff": key[1], "sink": key[2], "tasks": {}, "kpq": {},
                                    "pos": {}})
        _, value = metric_of(rec["task"], rec["metrics"])
        if value is not None:
            row["tasks"].setdefault(rec["task"], []).append(value)
        if rec.get("keys_per_query") is not None:
            row["kpq"].setdefault(rec["task"], []).append(rec["keys_per_query"])
        if is_position_task(rec["task"]):
            for name, v in rec["metrics"].items():
                if name.startswith("ppl@"):
                    row["pos"].setdefault(rec["task"], {}).setdefault(name, []).append(v)
    table = []
    for row in rows.values():
        scores = {t: statistics.fmean(v) * (1 if lower_is_better(t) else 100) for t, v in row["tasks"].items()}
        accuracy = [t for t in cfg.tasks if not lower_is_better(t)]
        done = [scores[t] for t in accuracy if t in scores]
        budgets = {t: statistics.fmean(v) for t, v in row["kpq"].items()}
        entry = {"mode": row["mode"], "w_eff": row["w_eff"], "sink": row["sink"], **scores,
                 "avg": statistics.fmean(done) if done and len(done) == len(accuracy) else None,
                 "kpq": _mean([budgets[t] for t in accuracy if t in budgets])}
        entry.update({f"kpq:{t}": b for t, b in budgets.items()})
        for task, by_bucket in row["pos"].items():
            entry[f"pos:{task}"] = {name: statistics.fmean(v) for name, v in by_bucket.items()}
        table.append(entry)
    return table


def _mean(values: list[float]) -> float | None:
    return statistics.fmean(values) if values else None


def mode_label(mode: str, sink: int = 0) -> str:
    base = "MoBA" if mode == "moba" else mode.replace("_", "+").upper()
    return f"{base}+sink{sink}" if sink else base


def _row_order(cfg: SweepConfig):
    return lambda r: (cfg.modes.index(r["mode"]), r.get("sink", 0))


def markdown(cfg: SweepConfig, table: list[dict]) -> str:
    from ..eval.table import emphasize, ranks

    cols = [*cfg.tasks, "avg"]
    lower = {c: lower_is_better(c) for c in cfg.tasks} | {"avg": False}
    heads = [label_of(t) + (" ↓" if lower[t] else "") for t in cfg.tasks]
    lines = ["| w_eff | Mode | keys/q | " + " | ".join(heads) + " | Avg. |", "|---|---|---:|" + "---|" * len(cols)]

    def fmt(r, col):
        value = r.get(col)
        return "–" if value is None else f"{value:.2f}" if lower[col] else f"{value:.1f}"

    def kpq(r):
        return "–" if r.get("kpq") is None else f"{r['kpq']:.1f}"

    for w in sorted({r["w_eff"] for r in table if r["w_eff"] is not None}):
        group = sorted((r for r in table if r["w_eff"] == w), key=_row_order(cfg))
        marks = {col: ranks([r.get(col) for r in group], lower[col]) if len(group) > 1 else {} for col in cols}
        for i, r in enumerate(group):
            cells_ = [emphasize(fmt(r, col), marks[col].get(i)) for col in cols]
            lines.append(f"| {w} | {mode_label(r['mode'], r.get('sink', 0))} | {kpq(r)} | " + " | ".join(cells_) + " |")
    for r in table:
        if r["mode"] == "full":
            lines.append(f"| all | Full | {kpq(r)} | " + " | ".join(fmt(r, c) for c in cols) + " |")
    return "\n".join(lines) + "\n"


def _series(cfg: SweepConfig, table: list[dict]):
    """(mode, sink, rows) for every line of the plots, in the config's order."""
    for mode in cfg.modes:
        if mode == "full":
            continue
        for sink in sorted({r.get("sink", 0) for r in table if r["mode"] == mode}):
            yield mode, sink, [r for r in table if r["mode"] == mode and r.get("sink", 0) == sink]


def _style(mode: str, sink: int) -> dict:
    from ..analysis.report import COLORS

    return {"color": COLORS.get(mode), "linestyle": "--" if sink else "-", "marker": "s" if sink else "o",
            "label": mode_label(mode, sink)}


def _figure(n_panels: int, plt):
    ncol = min(4, n_panels)
    nrow = -(-n_panels // ncol)
    fig, axes = plt.subplots(nrow, ncol, figsize=(4.2 * ncol, 3.3 * nrow), squeeze=False)
    for ax in list(axes.flat)[n_panels:]:
        ax.axis("off")
    return fig, axes


def _ylabel(col: str) -> str:
    return "perplexity" if col != "avg" and lower_is_better(col) else "accuracy (%)"


def plots(cfg: SweepConfig, table: list[dict], out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    full = next((r for r in table if r["mode"] == "full"), None)
    written = []
    # Figures 4-8: score against w_eff; budget.png: the same scores against the keys each query attended
    for name, columns, x_of in (("average", ["avg"], None), ("tasks", cfg.tasks, None),
                                ("budget", ["avg", *cfg.tasks], "kpq")):
        fig, axes = _figure(len(columns), plt)
        for ax, col in zip(axes.flat, columns):
            xkey = None if x_of is None else ("kpq" if col == "avg" else f"kpq:{col}")
            for mode, sink, rows in _series(cfg, table):
                pts = sorted((r["w_eff"] if xkey is None else r.get(xkey), r[col]) for r in rows
                             if r.get(col) is not None and (xkey is None or r.get(xkey) is not None))
                if pts:
                    ax.plot(*zip(*pts), **_style(mode, sink))
            if full is not None and full.get(col) is not None:
                ax.axhline(full[col], color="gray", linestyle=":", label="Full")
            ax.set_xscale("log", base=2)
            if xkey is None:
                ticks = sorted({r["w_eff"] for r in table if r["w_eff"] is not None})
                ax.set_xticks(ticks, [str(t) for t in ticks])
                ax.minorticks_off()
            ax.set(xlabel="effective window $w_{eff}$" if xkey is None else "keys per query (measured)",
                   ylabel=_ylabel(col), title="Average" if col == "avg" else label_of(col))
            if col != "avg" and lower_is_better(col):
                ax.set_yscale("log")
            ax.grid(alpha=0.3, which="both")
            ax.legend(fontsize=6)
        fig.suptitle(f"{cfg.model}: training-free prefill attention" +
                     (", score against the measured budget" if x_of else ""), fontsize=10)
        fig.tight_layout()
        path = out / f"{name}.png"
        savefig(fig, path, dpi=150)
        plt.close(fig)
        written.append(path)
    position = position_plot(cfg, table, out, plt)
    return written + ([position] if position else [])


def position_plot(cfg: SweepConfig, table: list[dict], out: Path, plt) -> Path | None:
    """position.png: perplexity by distance from the start, one panel per (position task, window)."""
    tasks = [t for t in cfg.tasks if is_position_task(t)]
    windows = sorted({r["w_eff"] for r in table if r["w_eff"] is not None})
    if not tasks or not windows:
        return None
    full = next((r for r in table if r["mode"] == "full"), None)
    panels = [(t, w) for t in tasks for w in windows]
    fig, axes = _figure(len(panels), plt)
    for ax, (task, w) in zip(axes.flat, panels):
        for mode, sink, rows in _series(cfg, table):
            row = next((r for r in rows if r["w_eff"] == w and f"pos:{task}" in r), None)
            if row:
                _draw_buckets(ax, row[f"pos:{task}"], **_style(mode, sink))
        if full and f"pos:{task}" in full:
            _draw_buckets(ax, full[f"pos:{task}"], color="gray", linestyle=":", label="Full")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set(xlabel="tokens before the predicted one", ylabel="perplexity", title=f"{label_of(task)}, w_eff={w}")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=6)
    fig.suptitle(f"{cfg.model}: perplexity by position", fontsize=10)
    fig.tight_layout()
    path = out / "position.png"
    savefig(fig, path, dpi=150)
    plt.close(fig)
    return path


def _draw_buckets(ax, by_bucket: dict[str, float], **style) -> None:
    pts = []
    for name, value in by_bucket.items():
        lo, hi = (int(x) for x in name.removeprefix("ppl@").split("-"))
        pts.append((math.sqrt(lo * (hi + 1)), value))  # the bucket's geometric middle
    ax.plot(*zip(*sorted(pts)), **style)


def report(cfg: SweepConfig, out: Path) -> dict:
    table = collect(cfg, out)
    write_text(out / "results.json", json.dumps({"config": asdict(cfg), "rows": table}, indent=2))
    write_csv(out / "results.csv", table,
              fields=["mode", "w_eff", "sink", *cfg.tasks, "avg", "kpq", *(f"kpq:{t}" for t in cfg.tasks)])
    text = markdown(cfg, table)
    write_text(out / "table.md", text)
    figures = plots(cfg, table, out)
    print(text)
    print(f"wrote {out / 'results.json'}, results.csv, table.md, {', '.join(p.name for p in figures)}")
    return {"rows": table, "table": text}


def load_config(argv: list[str] | None = None) -> SweepConfig:
    """The sweep config from ``--config FILE`` and flag overrides (as ``cli.py sweep`` and ``cli.py submit`` read it)."""
    from jsonargparse import ActionConfigFile, ArgumentParser

    parser = ArgumentParser(prog="cli.py sweep", description=__doc__.splitlines()[0])
    parser.add_argument("--config", action=ActionConfigFile)
    parser.add_argument("--preset", type=str | None, default=None,
                        help="apply the config's presets[NAME] (flags given on the command line still win)")
    parser.add_class_arguments(SweepConfig, nested_key=None, fail_untyped=False)
    argv = list(sys.argv[2:] if argv is None else argv)
    args = vars(parser.parse_args(argv))
    if args.get("preset"):
        presets = args.get("presets") or {}
        if args["preset"] not in presets:
            raise ValueError(f"unknown preset {args['preset']!r}; this config has "
                             f"{', '.join(presets) or 'no presets'}.")
        unknown = set(presets[args["preset"]]) - set(SweepConfig.__dataclass_fields__)
        if unknown:
            raise ValueError(f"preset {args['preset']!r} sets unknown field(s) {', '.join(sorted(unknown))}.")
        # the preset goes in as flags right after the config file: over the file, under the user's own flags
        flags = [part for key, value in presets[args["preset"]].items()
                 for part in (f"--{key}", value if isinstance(value, str) else json.dumps(value))]
        cut = max((i + (1 if a.startswith("--config=") else 2) for i, a in enumerate(argv)
                   if a == "--config" or a.startswith("--config=")), default=0)
        args = vars(parser.parse_args(argv[:cut] + flags + argv[cut:]))
    values = {k: v for k, v in args.items() if k in SweepConfig.__dataclass_fields__}
    return SweepConfig(**values)


def main(argv: list[str] | None = None) -> dict:
    return run(load_config(argv))
