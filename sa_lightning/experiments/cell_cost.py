"""``cli.py bench cell``: where a trained cell's time goes, and how far it runs above its FLOP floor on this machine.

The cell is a study's, trained as the study trains it: the fit line ``study long-range --preset decide-l4`` would
run for the variant (its config, swaps and ``fit_overrides``; ``--seq_lens`` and ``--set`` change it), in this
process, on ``--threads`` threads (1: one ``--jobs`` worker's share of the cores). ``--config FILE`` times a plain
``cli.py fit --config FILE`` instead (the README's tiny fit). Each cell:

1. **trains** ``--steps`` steps of its own fit (Lightning's loop, its callbacks, logger and checkpointing) under
   Lightning's ``SimpleProfiler``, validating once at the end, then saves a checkpoint and scores the model as the
   study does (its σ seeds). The parts, per step or per event, are scaled to the whole cell: its ``max_steps``
   steps, its validations (every ``val_check_interval`` steps, and the sanity check), its checkpoint saves and its
   scoring. Lightning's own work is what the training loop took beyond the parts its profiler names. The first
   two steps are timed apart (a compiled model compiles in them): only their excess over the rest is added, once.
2. **splits forward and backward** by op (``torch.profiler`` over ``--profile_steps`` steps of the same model and
   batches, outside Lightning): the linear layers' matrix products, the attention kernels (the variant's own ops
   and its batched products), the draw, the loss, and the element-wise rest (norms, RoPE, gates, SwiGLU, residual
   adds, their backward). The profiler's shares are applied to the unprofiled forward and backward time.
3. **counts the step's FLOPs**: the matrix products the step runs (``torch.utils.flop_counter.FlopCounterMode``
   on one forward and backward: the linear layers and the band kernels' batched products; PyTorch's fused SDPA
   kernels on the CPU are not counted by it), beside the FLOPs the variant needs
   (``models.flops.train_flops_per_token``: 6N + 12·L·d·keys per token, keys the variant's ``keys_computed``:
   w for a band, n/2 for full attention).
4. **measures this machine's fp32 GEMM rate at the step's own shapes**: each distinct 2-D product of the step
   (the linear layers' forward and backward), timed alone on the same threads. The **floor** is the FLOPs the
   variant needs at that rate (FLOP-weighted over the shapes), times the cell's steps: the time of its arithmetic
   alone. ``× floor`` is the cell's training time over it.

``--against banded`` (or ``dense``) also times forward and backward of the same model on the same batches with every
layer on that backend, in turns with the cell's own route, round by round: the CPU's fused route against the
variants' own kernels, side by side. ``--against eager``, for a cell with ``--set model.compile=true``: its compiled
blocks against the same blocks eager.

Seeds per core-hour = 3600 / (the cell's projected seconds × threads). The table names the machine, its threads,
and its load at the start and the end (``os.getloadavg``).

    python cli.py bench cell [--variants sa random swa full] [--seq_lens 128 512] [--steps 60] [--against banded]
    python cli.py bench cell --set model.compile=true --against eager
    python cli.py bench cell --config configs/tiny.yaml --steps 20
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from datetime import date
from pathlib import Path

import torch

from ..utils.argtypes import doc_help, key_values, positive_int
from ..utils.atomic import add_overwrite, output_folder, replacing_files, write_text
from ..utils.report import head, row
from ..utils.host import cpu_name

#: the study and preset whose cell is timed by default: the deciding pass-key cell (n = 128, L = 4, w = 16, d = 64,
#: batch 32, 600 steps, validation every 100 on 256 answers, scored under two σ seeds)
STUDY_CONFIG, STUDY_PRESET = "configs/study/long_range.yaml", "decide-l4"
SEQ_KEYS = ("data.init_args.seq_len", "model.arch.max_seq_len")
#: the model-level parts of forward and backward, by op name (the first part whose pattern an op's name holds)
OP_PARTS = (
    ("draw", ("randperm", "argsort", "randint", "uniform_", "random_", "bernoulli", "pair_hash")),
    ("loss", ("log_softmax", "logsoftmax", "nll_loss", "cross_entropy")),
    ("attention kernel", ("window", "band", "attention", "flash", "softmax", "logsumexp", "bmm", "baddbmm",
                          "scatter_add", "index_select", "gather", "index_add", "masked_fill")),
    ("linear GEMMs", ("aten::mm", "aten::addmm", "aten::matmul", "aten::linear")),
)
STEP_PARTS = tuple(name for name, _ in OP_PARTS) + ("element-wise and other",)
#: Lightning's profiler actions per training step, by the part they are counted in
STEP_ACTIONS = {
    "data": ("[_TrainingEpochLoop].train_dataloader_next", ".batch_to_device"),  # the strategy's, the module's in it
    "forward": ("training_step",),
    "backward": ("backward",),
    "gradient clip and norm": ("on_before_optimizer_step", "configure_gradient_clipping"),
}


def op_part(name: str) -> str:
    low = name.lower()
    return next((part for part, keys in OP_PARTS if any(k in low for k in keys)), STEP_PARTS[-1])


# ---- the cell's fit line ---------------------------------------------------------------------------------------
def study_fit_line(variant: str, seq_len: int | None, sets: dict, folder: Path) -> tuple[list[str], dict, dict]:
    """The ``fit`` arguments (without ``fit``) of the study cell of ``variant`` (its first seed), the cell, and its
    spec (the scoring settings the study gives it)."""
    from .long_range import EXPERIMENT

    cfg = EXPERIMENT.load(STUDY_CONFIG, STUDY_PRESET)
    if variant not in cfg.variants:
        cfg.variants = list(cfg.variants) + [variant]
    cell = next(c for c in EXPERIMENT.cells(cfg) if c["variant"] == variant)
    overrides = dict(cfg.fit_overrides or {})
    if seq_len is not None:
        overrides.update({key: seq_len for key in SEQ_KEYS})
    cfg.fit_overrides = {**overrides, **sets}
    spec = {**EXPERIMENT.spec(cell, cfg, folder), "fit_args": EXPERIMENT.fit_args(cell, cfg, folder)}
    args = list(spec["fit_args"])
    args[args.index("--trainer.default_root_dir") + 1] = str(folder)
    spec["fit_args"] = args
    return args[1:], cell, spec


def config_fit_line(config: str, seq_len: int | None, sets: dict, folder: Path) -> list[str]:
    args = ["--config", config, "--trainer.default_root_dir", str(folder), "--trainer.enable_progress_bar", "false",
            "--trainer.enable_model_summary", "false"]
    for key, value in {**({k: seq_len for k in SEQ_KEYS} if seq_len else {}), **sets}.items():
        args += [f"--{key}", str(value)]
    return args


def schedule(cli) -> dict:
    """What the whole cell runs: its steps, validations (with the sanity check's batches), checkpoint saves."""
    from lightning.pytorch.callbacks import ModelCheckpoint

    from ..lit.lightning_private import saves_at_step

    trainer = cli.trainer
    steps = int(trainer.max_steps)
    interval = trainer.val_check_interval
    vals = steps // int(interval) if isinstance(interval, int) and interval > 0 else 1
    if trainer.limit_val_batches == 0:
        vals = 0
    saves = 0
    for cb in trainer.callbacks:
        if isinstance(cb, ModelCheckpoint):  # its periodic file, and last.ckpt beside it with save_last
            saves += sum(saves_at_step(cb, s) for s in range(1, steps + 1)) * (2 if cb.save_last else 1)
    return {"steps": steps, "validations": vals, "sanity_batches": int(trainer.num_sanity_val_steps or 0),
            "saves": saves}


# ---- 1. the cell under Lightning's profiler ---------------------------------------------------------------------
def lightning_split(args: list[str], steps: int, cell=None, spec=None, warmup: int = 2) -> dict:
    """Train ``steps`` steps of the fit line (validating once, at the end) under Lightning's ``SimpleProfiler``,
    save a checkpoint, score the model as the study does: each part's seconds per step (or per event), the whole
    cell's schedule, and the model and a batch for the op-level split."""
    import lightning as L
    from lightning.pytorch.profilers import SimpleProfiler

    from ..lit.cli import run as run_cli

    class Quiet(SimpleProfiler):
        def describe(self) -> None:  # the table goes in our report, not the log
            pass

    class Clock(L.Callback):
        def __init__(self):
            self.marks = {}
            self.val = []

        def on_train_start(self, trainer, pl_module):
            self.marks["train_start"] = time.perf_counter()

        def on_validation_start(self, trainer, pl_module):
            self._v = time.perf_counter()

        def on_validation_end(self, trainer, pl_module):
            self.val.append((trainer.sanity_checking, time.perf_counter() - self._v))

        def on_train_end(self, trainer, pl_module):
            self.marks["train_end"] = time.perf_counter()

    start = time.perf_counter()
    full = schedule(run_cli(args, run=False))
    cli = run_cli(args + ["--trainer.max_steps", str(steps), "--trainer.val_check_interval", str(steps)], run=False)
    profiler, clock = Quiet(), Clock()
    cli.trainer.profiler = profiler
    cli.trainer.callbacks.append(clock)
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    d = profiler.recorded_durations

    timed = steps - warmup  # the first steps (a compile, the allocator's first touches) are a part of their own

    def total(*names, contains=False):
        """Seconds of the named actions, an action run once a step counted from step ``warmup`` on; ``contains``
        matches the loop's, the strategy's and the module's actions by part of their name (callbacks apart)."""
        return sum(sum(v[warmup:] if len(v) >= steps else v) for k, v in d.items()
                   if (any(n in k for n in names) and not k.startswith("[Callback]") if contains else k in names))

    batches = d.get("run_training_batch", [])
    first = max(0.0, sum(batches[:warmup]) - warmup * (sum(batches[warmup:]) / max(1, len(batches) - warmup)))
    steps = timed  # every per-step part below is a mean over the timed steps
    per_step = {part: total(*names, contains=True) / steps for part, names in STEP_ACTIONS.items()}
    opt = total(*[k for k in d if k.endswith(".optimizer_step")]) / steps
    zero = total(*[k for k in d if k.endswith("optimizer_zero_grad")]) / steps
    inner = per_step["forward"] + per_step["backward"] + per_step["gradient clip and norm"]
    in_closure_hooks = total(*[k for k in d if k.startswith("[Callback]") and any(
        h in k for h in ("on_before_backward", "on_after_backward", "on_before_optimizer_step", "on_before_zero_grad"))])
    per_step["optimizer"] = max(0.0, opt - inner - in_closure_hooks / steps) + zero
    # every callback's hooks in training (a zero-shot evaluation every N steps, attention maps at the end), and the
    # module's own batch hooks; validation's hooks are in validation's time, the checkpoint callback's apart
    in_training = [k for k in d if (k.startswith("[Callback]") and "ModelCheckpoint" not in k
                                    and not any(h in k for h in ("validation", "sanity", "before_optimizer_step",
                                                                 "before_backward", "after_backward",
                                                                 "before_zero_grad")))
                   or (k.startswith("[LightningModule]") and any(h in k for h in (
                       "on_train_batch_start", "on_train_batch_end", "lr_scheduler_step", "on_train_end")))]
    per_step["callbacks and logging"] = (total(*in_training) + in_closure_hooks) / steps
    per_step["checkpoint callback"] = total(*[k for k in d if "ModelCheckpoint" in k and "train_batch_end" in k]) / steps
    loop = clock.marks["train_end"] - clock.marks["train_start"] - sum(batches[:warmup])
    val_fit = sum(s for sanity, s in clock.val if not sanity)
    sanity = sum(s for sanity, s in clock.val if sanity)
    saves_in_fit = total("save_checkpoint")
    accounted = sum(per_step.values()) * steps + val_fit + sanity + saves_in_fit
    per_step["Lightning's own per-step work"] = max(0.0, loop - accounted) / steps
    setup = clock.marks["train_start"] - start - sanity  # parse, model, data, fit's setup before the first step

    ckpt = Path(cli.trainer.default_root_dir) / "bench_cell.ckpt"
    t = time.perf_counter()
    cli.trainer.save_checkpoint(ckpt)
    save = time.perf_counter() - t
    ckpt.unlink(missing_ok=True)
    scoring = None
    if cell is not None:
        from .long_range import EXPERIMENT

        t = time.perf_counter()
        EXPERIMENT.score_cell(cell, spec, cli, 0.0, steps)
        scoring = time.perf_counter() - t
    n_val = max(1, sum(1 for sanity_, _ in clock.val if not sanity_))
    return {"per_step": per_step, "validation": val_fit / n_val, "sanity": sanity, "save": save, "setup": setup,
            "first": first,
            "scoring": scoring, "schedule": full, "cli": cli}


# ---- 2. forward and backward by op; 3. the FLOPs; 4. the GEMM rate ---------------------------------------------
def step_fn(cli, batches):
    model = cli.model
    state = {"i": 0}

    def step():
        i = state["i"] % len(batches)
        state["i"] += 1
        model.zero_grad(set_to_none=True)
        model.loss(batches[i], 10_000 + state["i"]).backward()

    return step


def interleaved(cli, batches, backend: str, rounds: int, steps: int) -> dict:
    """Forward and backward of the cell's model on its own route and with every layer on ``backend`` instead, in
    turns (``steps`` steps each, ``rounds`` rounds): seconds a step of each (medians), and the ratio within each
    round (a shared machine's drifting load moves both sides of it)."""
    from dataclasses import replace

    net = cli.model.net
    layers, compiled = [b.attn for b in net.blocks], net._compiled_blocks  # our model's own: None when eager
    if backend == "eager" and compiled is None:
        raise SystemExit("error: --against eager compares a compiled cell with its eager blocks: give --set "
                         "model.compile=true.")
    own = [layer.spec for layer in layers]
    step = step_fn(cli, batches)
    step()  # a compiled model compiles here, before either side is timed
    times = {"own": [], backend: []}
    for _ in range(rounds):
        for case in ("own", backend):
            if backend == "eager":
                net._compiled_blocks = compiled if case == "own" else None
            for layer, spec in zip(layers, own):
                layer.spec = spec if case == "own" or backend == "eager" else replace(spec, backend=backend)
            step()  # the first step of a turn is not timed
            t = time.perf_counter()
            for _ in range(steps):
                step()
            times[case].append((time.perf_counter() - t) / steps)
    for layer, spec in zip(layers, own):
        layer.spec = spec
    net._compiled_blocks = compiled
    ratios = sorted(b / a for a, b in zip(times["own"], times[backend]))
    return {"backend": backend, "own_s": statistics.median(times["own"]),
            "against_s": statistics.median(times[backend]), "ratio": statistics.median(ratios),
            "range": (ratios[0], ratios[-1])}


def op_split(step, calls: int) -> dict[str, float]:
    """Each model-level part's share of forward and backward (``OP_PARTS``), from ``torch.profiler``'s self times."""
    from torch.profiler import ProfilerActivity, profile

    from ..utils.quiet import quiet_profiler

    step()
    with quiet_profiler(), profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(calls):
            step()
    parts = dict.fromkeys(STEP_PARTS, 0.0)
    for evt in prof.key_averages():
        # autograd's wrappers (``...Backward0``, ``autograd::engine::...``) hold no compute of their own but a custom
        # autograd function's backward does: it is counted by name like any op
        parts[op_part(evt.key)] += evt.self_cpu_time_total
    whole = sum(parts.values()) or 1.0
    return {k: v / whole for k, v in parts.items()}


class _Products(torch.utils._python_dispatch.TorchDispatchMode):
    """The 2-D matrix products a step runs: ``(m, k, n)`` of each ``mm`` and ``addmm`` call."""

    def __init__(self):
        super().__init__()
        self.shapes = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func in (torch.ops.aten.mm.default, torch.ops.aten.addmm.default):
            a, b = (args[0], args[1]) if func is torch.ops.aten.mm.default else (args[1], args[2])
            self.shapes.append((a.shape[0], a.shape[1], b.shape[1]))
        return out


def gemm_rate(shapes: list[tuple[int, int, int]], repeats: int = 20) -> tuple[float, dict]:
    """The FLOP-weighted fp32 rate (FLOP/s) of ``shapes`` (each ``(m, k, n)``, as often as the step runs it), each
    distinct shape timed alone (the best of three rounds of ``repeats`` calls), and each shape's rate."""
    rates = {}
    for m, k, n in sorted(set(shapes)):
        a, b = torch.randn(m, k), torch.randn(k, n)
        torch.mm(a, b)
        best = float("inf")
        for _ in range(3):
            t = time.perf_counter()
            for _ in range(repeats):
                torch.mm(a, b)
            best = min(best, (time.perf_counter() - t) / repeats)
        rates[(m, k, n)] = 2 * m * k * n / best
    flops = sum(2 * m * k * n for m, k, n in shapes)
    seconds = sum(2 * m * k * n / rates[(m, k, n)] for m, k, n in shapes)
    return flops / seconds, rates


def flops_and_rate(cli, batch) -> dict:
    from torch.utils.flop_counter import FlopCounterMode

    from ..models.flops import matmul_params, train_flops_per_token

    model = cli.model
    model.zero_grad(set_to_none=True)
    counter, products = FlopCounterMode(display=False), _Products()
    with counter, products:
        model.loss(batch, 999_999).backward()
    model.zero_grad(set_to_none=True)
    counted = counter.get_total_flops()
    by_op = {str(op).split(".")[-2] if "." in str(op) else str(op): int(v)
             for op, v in counter.get_flop_counts().get("Global", {}).items()}
    inputs = model.targets_of(batch)[0]
    tokens, n = inputs.numel(), inputs.shape[1]
    needed = train_flops_per_token(model.arch, n, matmul_params(model.net)) * tokens
    rate, _ = gemm_rate(products.shapes)
    return {"counted": counted, "needed": needed, "by_op": by_op, "rate": rate, "tokens": tokens}


# ---- one cell, all four ---------------------------------------------------------------------------------------
def measure(label: str, args: list[str], steps: int, profile_steps: int, cell=None, spec=None,
            against: str | None = None, rounds: int = 5) -> dict:
    print(f"{label}: training {steps} steps under Lightning's profiler ...", flush=True)
    # a compiled model's graphs start afresh for each cell: the profiler's and the FLOP counter's modes of the cell
    # before made its blocks trace again, up to the compiler's limit, past which they would run eagerly
    torch.compiler.reset()
    split = lightning_split(args, steps, cell, spec)
    cli, sched = split.pop("cli"), split["schedule"]
    dm = cli.datamodule
    it = iter(dm.train_dataloader())
    batches = [next(it) for _ in range(max(2, profile_steps))]
    cli.model.train()
    versus = None
    if against:  # first: the profiler's and the FLOP counter's modes below make a compiled model trace again
        print(f"{label}: its route against backend {against}, {rounds} rounds in turns ...", flush=True)
        versus = interleaved(cli, batches, against, rounds, max(2, profile_steps))
    print(f"{label}: forward and backward by op over {profile_steps} steps, FLOPs, the GEMM rate ...", flush=True)
    shares = op_split(step_fn(cli, batches), profile_steps)
    flops = flops_and_rate(cli, batches[0])
    per = split["per_step"]
    train_step = sum(per.values())
    cell_steps = sched["steps"]
    parts = {"setup (parse, model, data)": split["setup"],
             "first steps beyond the rest (a compile)": split["first"],
             **{k: v * cell_steps for k, v in per.items()},
             "validation": split["validation"] * sched["validations"] + split["sanity"],
             "checkpoint saves": split["save"] * sched["saves"]}
    if split["scoring"] is not None:
        parts["scoring (σ seeds)"] = split["scoring"]
    floor = flops["needed"] / flops["rate"] * cell_steps
    training = train_step * cell_steps
    compute = (per["forward"] + per["backward"]) * cell_steps
    return {"label": label, "parts": parts, "total": sum(parts.values()), "training": training, "floor": floor,
            "shares": {k: v * compute for k, v in shares.items()}, "flops": flops, "schedule": sched,
            "steps_timed": steps, "ms_per_step": 1000 * train_step, "versus": versus}


def markdown(rows: list[dict], args, loads: tuple, threads: int) -> str:
    first = rows[0]["schedule"]
    where = (f"`{args.config}`" if args.config else
             f"the `{STUDY_PRESET}` cell of `study long-range` (`{STUDY_CONFIG}`)")
    lines = [f"# Where a trained cell's time goes ({date.today().isoformat()})", "",
             f"Machine: {cpu_name()}, {threads} thread(s), torch {torch.__version__}; load average {loads[0]:.2f} at the start, {loads[1]:.2f} at the end "
             f"(`os.getloadavg`, 1 min). Cell: {where}"
             + (", " + ", ".join(f"`{s}`" for s in args.sets) if args.sets else "")
             + f". Each cell trained {args.steps} steps under Lightning's `SimpleProfiler` and is scaled to its "
               f"whole schedule ({first['steps']} steps, {first['validations']} validations, {first['saves']} "
               "checkpoint saves); seconds of one core per cell.", ""]
    names = list(rows[0]["parts"])
    lines += head(["part"] + [r["label"] for r in rows], ["---"] + ["---:"] * len(rows))
    for name in names:
        lines.append(row([name] + [f"{r['parts'].get(name, 0.0):.1f}" for r in rows]))
    lines.append(row(["**the cell**"] + [f"**{r['total']:.1f}**" for r in rows]))
    lines += ["", "Forward and backward by op (seconds of the cell; `torch.profiler`'s shares of the unprofiled "
                  "time):", ""]
    lines += head(["op part"] + [r["label"] for r in rows], ["---"] + ["---:"] * len(rows))
    for part in STEP_PARTS:
        lines.append(row([part] + [f"{r['shares'][part]:.1f}" for r in rows]))
    lines += ["", "The floor: the FLOPs the variant needs a step (6N + 12·L·d·keys per token) at this machine's fp32 "
                  "GEMM rate at the step's own 2-D shapes (measured alone), times the cell's steps; the counted FLOPs "
                  "(`FlopCounterMode`: the linear layers and the band kernels' products, not the fused SDPA "
                  "kernels) beside them:", ""]
    lines += head(["", *[r["label"] for r in rows]], ["---"] + ["---:"] * len(rows))
    table = [
        ("ms per training step", lambda r: f"{r['ms_per_step']:.1f}"),
        ("GFLOP per step, the variant needs", lambda r: f"{r['flops']['needed'] / 1e9:.2f}"),
        ("GFLOP per step, counted", lambda r: f"{r['flops']['counted'] / 1e9:.2f}"),
        ("GEMM rate at the step's shapes, GFLOP/s", lambda r: f"{r['flops']['rate'] / 1e9:.0f}"),
        ("floor, s", lambda r: f"{r['floor']:.1f}"),
        ("training, s", lambda r: f"{r['training']:.1f}"),
        ("**training × floor**", lambda r: f"**{r['training'] / r['floor']:.2f}**"),
        ("the cell × floor", lambda r: f"{r['total'] / r['floor']:.2f}"),
        ("seeds per core-hour", lambda r: f"{3600 / (r['total'] * threads):.1f}"),
    ]
    for name, fn in table:
        lines.append(row([name] + [fn(r) for r in rows]))
    if rows[0].get("versus"):
        b = rows[0]["versus"]["backend"]
        lines += ["", f"Side by side (`--against {b}`): forward and backward of the same model on the same batches, "
                      f"its own route and {'its blocks eager' if b == 'eager' else f'every layer on the `{b}` backend'} in turns, {args.rounds} rounds of "
                      f"{max(2, args.profile_steps)} steps; × is `{b}`'s seconds over the route's within each round "
                      "(median [range]):", ""]
        lines += head(["", *[r["label"] for r in rows]], ["---"] + ["---:"] * len(rows))
        lines.append(row(["ms, its route"] + [f"{1000 * r['versus']['own_s']:.1f}" for r in rows]))
        lines.append(row([f"ms, {b}"] + [f"{1000 * r['versus']['against_s']:.1f}" for r in rows]))
        lines.append(row([f"**{b} × its route**"] + [
            f"**{r['versus']['ratio']:.2f}** [{r['versus']['range'][0]:.2f}, {r['versus']['range'][1]:.2f}]"
            for r in rows]))
    return "\n".join(lines) + "\n"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="cli.py bench cell", **doc_help(__doc__))
    p.add_argument("--variants", nargs="+", default=["sa", "random", "swa", "full"],
                   help="the study cell's variants to time (with --config: ignored)")
    p.add_argument("--seq_lens", nargs="+", type=positive_int, default=None,
                   help="sequence lengths (data and model), each a cell (default: the cell's own)")
    p.add_argument("--config", default=None,
                   help="time `cli.py fit --config FILE` instead of a study cell "
                        "(default: none, the cell of `study long-range --preset decide-l4`)")
    p.add_argument("--steps", type=positive_int, default=60, help="training steps timed per cell (then scaled)")
    p.add_argument("--profile_steps", type=positive_int, default=5, help="steps under torch.profiler per cell")
    p.add_argument("--threads", type=positive_int, default=1, help="torch threads (1: a study worker's share)")
    p.add_argument("--against", choices=["banded", "dense", "eager"], default=None,
                   help="also time forward and backward in turns with the cell's own: every layer on this backend "
                        "(banded: the variants' own kernels, the CPU's route before the fused one), or, for a cell "
                        "with --set model.compile=true, its blocks eager (default: none, the cell's own alone)")
    p.add_argument("--rounds", type=positive_int, default=5, help="rounds of --against's turns")
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                   help="a fit argument of the cell (repeatable), e.g. --set model.compile=true")
    p.add_argument("--out", type=output_folder, default="outputs/bench", help="the folder of cell.md and cell.json")
    add_overwrite(p)
    return p


def main(argv: list[str] | None = None) -> list[dict]:
    args = build_parser().parse_args(argv)
    sets = key_values(args.sets)
    if args.against == "eager" and str(sets.get("model.compile")).lower() not in ("true", "1"):
        raise SystemExit("error: --against eager compares a compiled cell with its eager blocks: give --set "
                         "model.compile=true.")
    if args.config and not Path(args.config).is_file():
        raise SystemExit(f"error: --config {args.config} is not a file.")
    if not args.config:
        from ..attention import get_variant

        for v in args.variants:
            try:
                get_variant(v)
            except (KeyError, ValueError) as e:
                raise SystemExit(f"error: --variants: {e}") from None
    torch.set_num_threads(args.threads)
    os.environ["TQDM_DISABLE"] = "1"
    from ..utils.quiet import quiet_lightning

    quiet_lightning("fit")
    loads = [os.getloadavg()[0]]
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench_cell_") as tmp:
        for n in args.seq_lens or [None]:
            for variant in ([None] if args.config else args.variants):
                label = (Path(args.config).stem if args.config else variant) + (f" n={n}" if n else "")
                folder = Path(tmp) / label.replace(" ", "_").replace("=", "")
                if args.config:
                    rows.append(measure(label, config_fit_line(args.config, n, sets, folder), args.steps,
                                        args.profile_steps, against=args.against, rounds=args.rounds))
                else:
                    fit, cell, spec = study_fit_line(variant, n, sets, folder)
                    rows.append(measure(label, fit, args.steps, args.profile_steps, cell, spec, args.against,
                                        args.rounds))
                r = rows[-1]
                print(f"{label}: {r['ms_per_step']:.0f} ms a step, the cell {r['total']:.0f} s, training "
                      f"{r['training'] / r['floor']:.2f}x its floor", flush=True)
    loads.append(os.getloadavg()[0])
    text = markdown(rows, args, tuple(loads), args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with replacing_files(out, "benchmark", args.overwrite) as tmp:
        write_text(tmp / "cell.md", text)
        write_text(tmp / "cell.json", json.dumps([{k: v for k, v in r.items()} for r in rows], indent=1,
                                                  default=str))
    print(text)
    return rows
