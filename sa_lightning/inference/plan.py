"""The plan of a training-free sweep (``cli.py sweep``): its config, its cells and their file names, and
what can be refused before a model loads. ``cluster.py`` splits a sweep into SLURM array tasks from its cells;
``experiments.sweep`` reads the config (the experiments' one parser) and runs the cells (``sweep.py``: one cell) and ``sweep_report.py`` turns them
into tables and plots.
"""
from __future__ import annotations

from argparse import ArgumentTypeError
from dataclasses import asdict, dataclass, field, replace

from ..attention import get_variant, variant_names
from ..attention.variants import FULL, MOBA, SA, SWA
from ..eval.position import context_length, is_position_task
from ..models.patcher import PatchSpec
from ..utils.argtypes import task_limit
from ..utils.report import task_label

#: task names that run model-written code (refused without confirm_run_unsafe_code)
CODE_TASKS = ("humaneval",)
#: how a comparison pairs A's settings with B's: the same w_eff, B at twice A's w_eff (gated SA+SWA's two bands
#: against one band of 2w), or B's setting whose measured keys per query on the task is nearest A's
MATCHES = ("equal_w", "double_w", "equal_keys")
#: the metric each task's column shows (the paper: accuracy; HellaSwag acc_norm; HumanEval pass@1)
METRICS = {"hellaswag": "acc_norm", "arc_challenge": "acc_norm", "humaneval": "pass@1",
           "humaneval_exec": "pass_at_k", "shakespeare_choice": "acc_norm"}


def metric_of(task: str, metrics: dict[str, float]) -> tuple[str, float | None]:
    if is_position_task(task):
        return "ppl", metrics.get("ppl")
    name = METRICS.get(task) or next((m for m in ("acc", "acc_norm", "exact_match", "pass@1") if m in metrics), None)
    return name, (metrics.get(name) if name else None)


def lower_is_better(task: str) -> bool:
    return is_position_task(task)


def column_label(task: str) -> str:
    """A task's column name: its short name, or ``PPL@<context>`` for a perplexity-by-position task."""
    return task_label(task, context_length(task) if is_position_task(task) else None)


@dataclass(frozen=True)
class Comparison:
    """One of the paper's comparisons, A against B, paired item by item (``compare.py``). ``sink``: only A's
    settings with that sink (default: every sink, each paired with B at the same sink)."""

    a: str
    b: str
    match: str = "equal_w"
    sink: int | None = None


def comparisons_of(cfg: "SweepConfig") -> list[Comparison]:
    """``cfg.comparisons`` checked: each names two variants and a match, in one sentence if not. A comparison of a
    mode that this run leaves out (``--modes`` narrower than the config's) stays in the list; ``compare.py`` says
    it has no cells."""
    out = []
    for i, entry in enumerate(cfg.comparisons or []):
        where = f"sweep comparisons[{i}]"
        if not isinstance(entry, dict) or not {"a", "b"} <= set(entry) or set(entry) - {"a", "b", "match", "sink"}:
            raise ValueError(f"{where} must be a mapping with keys a, b and optionally match and sink (e.g. "
                             f"{{a: {SA.name}, b: {SWA.name}, match: equal_w}}), got {entry!r}.")
        for side in ("a", "b"):
            try:
                get_variant(entry[side])
            except ValueError as err:  # a misspelt mode, with its close matches
                raise ValueError(f"{where} {side}: {err}") from None
        if entry.get("match", "equal_w") not in MATCHES:
            raise ValueError(f"{where} match must be one of {', '.join(MATCHES)}, got {entry['match']!r}.")
        if entry.get("sink") is not None and entry["sink"] not in cfg.sinks:
            raise ValueError(f"{where} sink {entry['sink']!r} is not one of the sweep's sinks {cfg.sinks}.")
        out.append(Comparison(**entry))
    return out


@dataclass
class SweepConfig:
    """The sweep's settings: a config file's keys, each also a flag.

    Args:
        model: a Hub id, a local folder of a causal LM (``save_pretrained`` output), a ``.gguf`` file, or
            ``smollm2`` once ``python cli.py fetch smollm2`` has placed it (``sa_lightning.models.sources``).
        tokenizer: a Hub id or folder of the tokenizer; null: the model's own.
        dtype: the weights' dtype: auto, bfloat16, float16 or float32.
        device_map: where the model's layers go (auto, cuda, cpu), as Hugging Face's ``device_map``; null: the CPU.
        batch_size: documents scored per forward pass.
        max_length: the longest input in tokens; null: the model's own limit.
        tasks: lm-eval task names (the offline ones work without a network), task sets such as ``table1``, or
            ``position_ppl_<n>`` (perplexity by token position over n tokens).
        modes: attention variants the patcher can swap in at prefill (every registry variant without learned
            gates: the training-free unions stand in for the gated pairs); ``full`` is the one baseline row.
        windows: the windows w of the windowed modes (swa, sa, sa_swa_union and the controls).
        moba_block_sizes: MoBA's block sizes c; its rows sit at w_eff = c * k.
        moba_top_k: MoBA's k, the blocks each query reads.
        sinks: attention sinks for the windowed rows (0: the paper's masks; k: the first k tokens of a row stay
            visible to every query, StreamingLLM's sinks).
        seeds: permutation seeds; the rows of ``seed_modes`` average over them, the other modes run the first seed
            only (their masks draw nothing).
        seed_modes: the modes that run every seed: the ones that draw sigma.
        sa_mode: ``stochastic`` (the paper's §3.3: every input draws its own sigma from the seed, the layer and its
            tokens) or ``deterministic`` (one sigma per seed, layer and length).
        limit: documents per task (an int, or a fraction < 1); null: every document.
        task_limits: per-task overrides of ``limit``, ``{task: limit}``.
        num_fewshot: few-shot examples per prompt; null: each task's own.
        confirm_run_unsafe_code: required for tasks that run model-written code (HumanEval).
        trust_remote_code: let the model's repo run its own code (off unless you opt in).
        comparisons: the paired comparisons ``compare.md`` reports, each ``{a: MODE, b: MODE, match: M}`` with M one
            of equal_w (B at A's w_eff), double_w (B at twice A's w_eff) or equal_keys (B's setting with the
            nearest measured keys per query on the same task), optionally ``sink: K``; a mode without a window
            (full) pairs with every setting of the other. Null: none.
        out: the sweep's folder: its cells, tables and plots.
    """

    model: str
    tokenizer: str | None = None
    dtype: str = "auto"
    device_map: str | None = None
    batch_size: int = 8
    max_length: int | None = None
    tasks: list[str] = field(default_factory=lambda: ["hellaswag", "mmlu", "arc_challenge", "boolq",
                                                       "lambada_openai", "arc_easy"])
    modes: list[str] = field(default_factory=lambda: [v.name for v in (FULL, SWA, SA, MOBA)])
    windows: list[int] = field(default_factory=lambda: [16, 32, 64, 128, 256, 512])
    moba_block_sizes: list[int] = field(default_factory=lambda: [32, 64, 128, 256])
    moba_top_k: int = 2
    sinks: list[int] = field(default_factory=lambda: [0])
    seeds: list[int] = field(default_factory=lambda: [0])
    #: the modes that run every seed: the ones that draw σ
    seed_modes: list[str] = field(default_factory=lambda: list(variant_names(draws=True, gated=False)))
    sa_mode: str = "stochastic"
    limit: float | None = None
    task_limits: dict[str, float] | None = None
    num_fewshot: int | None = None
    confirm_run_unsafe_code: bool = False
    trust_remote_code: bool = False
    comparisons: list[dict] | None = None
    out: str = "outputs/sweep"

    def __post_init__(self):
        from ..eval.harness import resolve_tasks
        from ..utils.runner import unique_seeds

        for mode in self.modes:
            PatchSpec(mode, get_variant(mode).min_window)  # an unknown or gated mode fails here, with close matches
        for name in ("windows", "moba_block_sizes"):
            for value in getattr(self, name):
                if value < 1:
                    raise ValueError(f"sweep {name} must all be >= 1, got {value}.")
        limits = {"limit": self.limit, **{f"task_limits {t}": v for t, v in (self.task_limits or {}).items()}}
        for where, limit in limits.items():
            try:
                limit is None or task_limit(str(limit))
            except ArgumentTypeError as err:
                raise ValueError(f"sweep {where} {err}.") from None
        if self.moba_top_k < 1:
            raise ValueError(f"sweep moba_top_k must be >= 1, got {self.moba_top_k}.")
        if not self.seeds:
            raise ValueError("sweep seeds must name at least one seed.")
        self.seeds = unique_seeds(self.seeds, "sweep seeds")
        for mode in self.seed_modes:
            PatchSpec(mode, get_variant(mode).min_window)  # a misspelt seed mode fails like a misspelt mode
        for sink in self.sinks:
            PatchSpec(SWA.name, 1, sink=sink)  # a negative or non-integer sink fails here, in one sentence
        for mode in (m for m in self.modes if get_variant(m).windowed):
            for w in self.windows:
                try:
                    PatchSpec(mode, w)  # a window below a control's least (random, strided: 3), before any cell
                except ValueError as err:
                    raise ValueError(f"sweep windows: {err} Drop that window or that mode.") from None
        PatchSpec(FULL.name, sa_mode=self.sa_mode)  # an unknown sa_mode fails here
        comparisons_of(self)  # a comparison of a mode the sweep does not run fails here, before any cell
        # lm-eval names, after the cheap checks (its index takes seconds the first time): task sets such as table1
        # expand, a misspelt one fails with its close matches; position_ppl_* is ours and stays as it is
        self.tasks = [name for t in self.tasks for name in ([t] if is_position_task(t) else resolve_tasks([t]))]
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
        fixed = "_det" if self.spec.sa_mode == "deterministic" and self.spec.draws else ""
        sink = f"_k{self.sink}" if self.sink else ""  # sink 0 keeps the names cells had before sinks existed
        return f"{self.mode}_w{self.w_eff or 'all'}{sink}_s{self.seed}{fixed}_{self.task}"


def cells(cfg: SweepConfig) -> list[Cell]:
    out = []
    for mode in cfg.modes:
        variant = get_variant(mode)
        if not variant.sparse:
            settings = [(None, PatchSpec(mode))]
        elif variant.blocked:
            settings = [(c * cfg.moba_top_k, PatchSpec(mode, None, c, cfg.moba_top_k)) for c in cfg.moba_block_sizes]
        else:
            settings = [(w, PatchSpec(mode, w, sink=k)) for w in cfg.windows for k in cfg.sinks]
        seeds = cfg.seeds if mode in cfg.seed_modes else cfg.seeds[:1]
        for w_eff, spec in settings:
            for seed in seeds:
                for task in cfg.tasks:
                    out.append(Cell(mode, w_eff, seed, task, replace(spec, seed=seed, sa_mode=cfg.sa_mode)))
    return out


def made_by(cfg: "SweepConfig", cell: Cell, weights: str | None = None) -> dict:
    """Everything besides the cell's spec that its score depends on: a finished cell is reused only when all of
    it matches (a sweep into an older sweep's folder must not report the old model's scores as its own), the
    model's weights by their fingerprint (``weights``), so a folder exported again in place is not the same model."""
    return {"model": cfg.model, "weights": weights, "tokenizer": cfg.tokenizer, "dtype": cfg.dtype,
            "max_length": cfg.max_length, "limit": (cfg.task_limits or {}).get(cell.task, cfg.limit),
            "num_fewshot": cfg.num_fewshot}


def cell_spec(cell: Cell, made: dict) -> dict:
    """Every input that made a cell: its patch (mode, window, sink, seed, sa_mode) and ``made_by`` (the model by its
    weights' bytes, the tokenizer, the limit, ...). A record holding an equal spec stands for the cell."""
    return {**asdict(cell.spec), "made_by": made}


def context_of(task: str) -> int | None:
    """The tokens a long-context task puts in one prompt (None: a task of short documents)."""
    from ..eval.offline import CONTEXT_LENGTHS

    return context_length(task) if is_position_task(task) else CONTEXT_LENGTHS.get(task)


def load_error(cfg: SweepConfig, err: Exception) -> ValueError:
    """One sentence for a model that cannot be read: one that ships its own code, or one not found."""
    text = str(err)
    if "trust_remote_code" in text:
        return ValueError(f"model {cfg.model!r} ships its own code; it runs only if you opt in with "
                          "trust_remote_code: true.")
    return ValueError(f"model {cfg.model!r} cannot be loaded: it is neither a local model folder, a GGUF file nor a "
                      f"reachable Hub repo ({text.splitlines()[0][:200] if text else type(err).__name__}).")


def check_before_loading(cfg: SweepConfig, source, tasks: list[str]) -> None:
    """What can be refused from the model's config alone (cheap), before its weights load: a task context
    or a MoBA window longer than ``max_position_embeddings``."""
    from ..models.sources import load_config as load_model_config

    try:
        config = load_model_config(source, cfg.trust_remote_code)
    except (OSError, ValueError) as err:
        raise load_error(cfg, err) from None
    limit = getattr(config, "max_position_embeddings", None)
    if not limit:
        return
    too_long = [f"{t} ({context_of(t)} tokens)" for t in tasks if (context_of(t) or 0) > limit]
    if too_long:
        raise ValueError(f"task(s) {', '.join(too_long)} need a longer context than the model's "
                         f"max_position_embeddings={limit}; drop them from tasks.")
    too_wide = sorted({c * cfg.moba_top_k for c in cfg.moba_block_sizes if c * cfg.moba_top_k > limit}) \
        if any(get_variant(m).blocked for m in cfg.modes) else []
    if too_wide:
        raise ValueError(f"MoBA's block_size * top_k = {too_wide} does not fit the model's "
                         f"max_position_embeddings={limit}; drop those moba_block_sizes.")
