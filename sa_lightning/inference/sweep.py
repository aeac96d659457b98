"""``cli.py sweep``: the paper's training-free window sweeps (§4.2, Tables 4-5, Figures 4-8).

    python cli.py sweep --config configs/sweep/qwen3_8b.yaml [--limit 200] [--out outputs/sweep/qwen3_8b]

One model is loaded once; every cell (mode, window, seed, task) patches its prefill and runs one
lm-eval task. Each finished cell is written at once to ``<out>/cells/``, and a rerun skips the cells
already there, so a killed sweep resumes where it stopped. At the end: ``results.json``,
``results.csv``, ``table.md`` (rows w_eff x mode, columns the tasks and their average; best in bold
and second underlined within each w_eff) and the plots ``average.png`` (Figure 4) and ``tasks.png``
(Figures 5-8).
"""
from __future__ import annotations

import csv
import json
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .patcher import PatchSpec

#: the metric each task's column shows (the paper: accuracy; HellaSwag acc_norm; HumanEval pass@1)
METRICS = {"hellaswag": "acc_norm", "arc_challenge": "acc_norm", "humaneval": "pass@1",
           "humaneval_exec": "pass_at_k", "shakespeare_choice": "acc_norm"}
LABELS = {"hellaswag": "Hella.", "mmlu": "MMLU", "arc_challenge": "ARC-C", "boolq": "BoolQ", "lambada_openai": "LMB",
          "arc_easy": "ARC-E", "humaneval": "HuEval", "humaneval_exec": "HuEval", "shakespeare_lastword": "LW", "shakespeare_choice": "MC"}
CODE_TASKS = ("humaneval",)


@dataclass
class SweepConfig:
    """Args:
        model: a Hub id or a local folder of a causal LM (``save_pretrained`` output).
        tokenizer: defaults to the model's.
        dtype: auto | bfloat16 | float16 | float32. device_map: e.g. auto, cuda, cpu.
        tasks: lm-eval task names (the offline ones work without a network).
        modes: any of full, swa, sa, sa_swa, moba; ``full`` is the one baseline row.
        windows: w for swa, sa and sa_swa. moba_block_sizes, moba_top_k: MoBA rows at w_eff = c * k.
        seeds: SA permutation seeds (SA rows average over them). limit: documents per task.
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
    seeds: list[int] = field(default_factory=lambda: [0])
    sa_mode: str = "stochastic"
    limit: float | None = None
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
    def key(self) -> str:
        fixed = "_det" if self.spec.sa_mode == "deterministic" and self.mode in ("sa", "sa_swa") else ""
        return f"{self.mode}_w{self.w_eff or 'all'}_s{self.seed}{fixed}_{self.task}"


def cells(cfg: SweepConfig) -> list[Cell]:
    out = []
    for mode in cfg.modes:
        if mode == "full":
            settings = [(None, PatchSpec("full"))]
        elif mode == "moba":
            settings = [(c * cfg.moba_top_k, PatchSpec("moba", None, c, cfg.moba_top_k)) for c in cfg.moba_block_sizes]
        else:
            settings = [(w, PatchSpec(mode, w)) for w in cfg.windows]
        seeds = cfg.seeds if mode in ("sa", "sa_swa") else cfg.seeds[:1]
        for w_eff, spec in settings:
            for seed in seeds:
                for task in cfg.tasks:
                    out.append(Cell(mode, w_eff, seed, task, PatchSpec(spec.mode, spec.window, spec.block_size,
                                                                       spec.top_k, seed, sa_mode=cfg.sa_mode)))
    return out


def metric_of(task: str, metrics: dict[str, float]) -> tuple[str, float | None]:
    name = METRICS.get(task) or next((m for m in ("acc", "acc_norm", "exact_match", "pass@1") if m in metrics), None)
    return name, (metrics.get(name) if name else None)


def load_model(cfg: SweepConfig):
    """The Hugging Face model and tokenizer; clear sentences for a missing model and for remote code."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    dtype = {"auto": "auto", "bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}[cfg.dtype]
    try:
        model = AutoModelForCausalLM.from_pretrained(cfg.model, dtype=dtype, device_map=cfg.device_map,
                                                     trust_remote_code=cfg.trust_remote_code)
        tokenizer = AutoTokenizer.from_pretrained(cfg.tokenizer or cfg.model, trust_remote_code=cfg.trust_remote_code)
    except (OSError, ValueError) as err:
        text = str(err)
        if "trust_remote_code" in text:
            raise ValueError(f"model {cfg.model!r} ships its own code; it runs only if you opt in with "
                             "trust_remote_code: true.") from None
        raise ValueError(f"model {cfg.model!r} cannot be loaded: it is neither a local model folder nor a reachable "
                         f"Hub repo ({text.splitlines()[0][:200]}).") from None
    return model.eval(), tokenizer


def _done(path: Path, cell: Cell) -> bool:
    """A cell file counts as done only if it was run with this cell's exact spec (a file from before a
    change of spec, such as sa_mode, is run again rather than mixed into the table)."""
    if not path.exists():
        return False
    try:
        return json.loads(path.read_text()).get("spec") == asdict(cell.spec)
    except ValueError:
        return False


def run(cfg: SweepConfig) -> dict:
    from ..eval.harness import load_tasks, resolve_tasks, run_tasks
    from .lm import PatchedHFLM
    from .patcher import patch

    cfg.tasks = resolve_tasks(cfg.tasks)
    todo = cells(cfg)
    out = Path(cfg.out)
    (out / "cells").mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(asdict(cfg), indent=2))
    pending = [c for c in todo if not _done(out / "cells" / f"{c.key}.json", c)]
    print(f"sweep: {len(todo)} cells, {len(todo) - len(pending)} already done, {len(pending)} to run", flush=True)
    if pending:
        load_tasks(sorted({c.task for c in pending}))  # unreachable datasets fail before the model loads
        model, tokenizer = load_model(cfg)
        limit = getattr(model.config, "max_position_embeddings", None)
        too_wide = sorted({c.w_eff for c in pending if c.mode == "moba" and limit and c.w_eff > limit})
        if too_wide:  # fail before the first cell, not halfway through the sweep
            raise ValueError(f"MoBA's block_size * top_k = {too_wide} does not fit the model's "
                             f"max_position_embeddings={limit}; drop those moba_block_sizes.")
        lm = PatchedHFLM(model, tokenizer=tokenizer, batch_size=cfg.batch_size, max_length=cfg.max_length,
                         device=str(model.device))
        for i, cell in enumerate(pending, 1):
            start = time.perf_counter()
            patch(model, cell.spec)
            results = run_tasks(lm, [cell.task], limit=cfg.limit, seed=1234, num_fewshot=cfg.num_fewshot,
                                confirm_run_unsafe_code=cfg.confirm_run_unsafe_code)
            metrics = results.get(cell.task, {})
            record = {"mode": cell.mode, "w_eff": cell.w_eff, "seed": cell.seed, "task": cell.task,
                      "spec": asdict(cell.spec), "metrics": metrics, "seconds": time.perf_counter() - start}
            (out / "cells" / f"{cell.key}.json").write_text(json.dumps(record, indent=2))
            name, value = metric_of(cell.task, metrics)
            shown = f"{name}={value:.4f}" if value is not None else "no metric"
            print(f"[{i}/{len(pending)}] {cell.mode:>6} w_eff={cell.w_eff or 'all':>4} seed {cell.seed} "
                  f"{cell.task}: {shown} ({record['seconds']:.1f}s)", flush=True)
    return report(cfg, out)


def collect(cfg: SweepConfig, out: Path) -> list[dict]:
    """One row per (mode, w_eff): the task metrics averaged over seeds, and their mean."""
    records = [json.loads((out / "cells" / f"{c.key}.json").read_text()) for c in cells(cfg)
               if (out / "cells" / f"{c.key}.json").exists()]
    rows: dict[tuple, dict] = {}
    for rec in records:
        row = rows.setdefault((rec["mode"], rec["w_eff"]), {"mode": rec["mode"], "w_eff": rec["w_eff"], "tasks": {}})
        _, value = metric_of(rec["task"], rec["metrics"])
        if value is not None:
            row["tasks"].setdefault(rec["task"], []).append(value)
    table = []
    for row in rows.values():
        scores = {t: statistics.fmean(v) * 100 for t, v in row["tasks"].items()}
        done = [scores[t] for t in cfg.tasks if t in scores]
        table.append({"mode": row["mode"], "w_eff": row["w_eff"], **scores,
                      "avg": statistics.fmean(done) if len(done) == len(cfg.tasks) else None})
    return table


def mode_label(mode: str) -> str:
    return "MoBA" if mode == "moba" else mode.replace("_", "+").upper()


def markdown(cfg: SweepConfig, table: list[dict]) -> str:
    from ..eval.table import emphasize, ranks

    cols = [*cfg.tasks, "avg"]
    header = "| w_eff | Mode | " + " | ".join(LABELS.get(t, t) for t in cfg.tasks) + " | Avg. |"
    lines = [header, "|---|---|" + "---|" * len(cols)]
    for w in sorted({r["w_eff"] for r in table if r["w_eff"] is not None}):
        group = sorted((r for r in table if r["w_eff"] == w), key=lambda r: cfg.modes.index(r["mode"]))
        marks = {col: ranks([r.get(col) for r in group]) if len(group) > 1 else {} for col in cols}
        for i, r in enumerate(group):
            cells_ = [emphasize("–" if r.get(col) is None else f"{r[col]:.1f}", marks[col].get(i)) for col in cols]
            lines.append(f"| {w} | {mode_label(r['mode'])} | " + " | ".join(cells_) + " |")
    for r in table:
        if r["mode"] == "full":
            lines.append("| all | Full | " + " | ".join("–" if r.get(c) is None else f"{r[c]:.1f}" for c in cols) + " |")
    return "\n".join(lines) + "\n"


def plots(cfg: SweepConfig, table: list[dict], out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ..analysis.report import COLORS

    full = next((r for r in table if r["mode"] == "full"), None)
    written = []
    for name, columns in (("average", ["avg"]), ("tasks", cfg.tasks)):
        ncol = min(4, len(columns))
        nrow = -(-len(columns) // ncol)
        fig, axes = plt.subplots(nrow, ncol, figsize=(4.2 * ncol, 3.3 * nrow), squeeze=False)
        for ax, col in zip(axes.flat, columns):
            for mode in cfg.modes:
                if mode == "full":
                    continue
                pts = sorted((r["w_eff"], r[col]) for r in table if r["mode"] == mode and r.get(col) is not None)
                if pts:
                    ax.plot(*zip(*pts), "o-", color=COLORS.get(mode, None), label=mode_label(mode))
            if full is not None and full.get(col) is not None:
                ax.axhline(full[col], color="gray", linestyle="--", label="Full")
            ticks = sorted({r["w_eff"] for r in table if r["w_eff"] is not None})
            ax.set_xscale("log", base=2)
            ax.set_xticks(ticks, [str(t) for t in ticks])
            ax.minorticks_off()
            ax.set(xlabel="effective window $w_{eff}$", ylabel="accuracy (%)",
                   title="Average" if col == "avg" else LABELS.get(col, col))
            ax.grid(alpha=0.3, which="both")
            ax.legend(fontsize=7)
        for ax in list(axes.flat)[len(columns):]:
            ax.axis("off")
        fig.suptitle(f"{cfg.model}: training-free prefill attention", fontsize=10)
        fig.tight_layout()
        path = out / f"{name}.png"
        fig.savefig(path, dpi=150)
        plt.close(fig)
        written.append(path)
    return written


def report(cfg: SweepConfig, out: Path) -> dict:
    table = collect(cfg, out)
    (out / "results.json").write_text(json.dumps({"config": asdict(cfg), "rows": table}, indent=2))
    with (out / "results.csv").open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=["mode", "w_eff", *cfg.tasks, "avg"])
        writer.writeheader()
        writer.writerows(table)
    text = markdown(cfg, table)
    (out / "table.md").write_text(text)
    figures = plots(cfg, table, out)
    print(text)
    print(f"wrote {out / 'results.json'}, results.csv, table.md, {', '.join(p.name for p in figures)}")
    return {"rows": table, "table": text}


def load_config(argv: list[str] | None = None) -> SweepConfig:
    """The sweep config from ``--config FILE`` and flag overrides (as ``cli.py sweep`` and ``cli.py submit`` read it)."""
    from jsonargparse import ActionConfigFile, ArgumentParser

    parser = ArgumentParser(prog="cli.py sweep", description=__doc__.splitlines()[0])
    parser.add_argument("--config", action=ActionConfigFile)
    parser.add_class_arguments(SweepConfig, nested_key=None, fail_untyped=False)
    args = parser.parse_args(argv)
    return SweepConfig(**{k: v for k, v in vars(args).items() if k in SweepConfig.__dataclass_fields__})


def main(argv: list[str] | None = None) -> dict:
    return run(load_config(argv))
