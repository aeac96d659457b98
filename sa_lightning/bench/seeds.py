"""``cli.py bench seeds``: training seeds per hour of one cell, each seed alone (today's ``cli.py fit``, Lightning's
loop) against K seeds as one ensemble (``lit.seeds``), side by side on this machine.

The cell is the pass-key task's (``configs/synthetic/passkey.yaml`` with the long-range study's powered cell:
n = 128, L = 2, w = 16, 600 steps; ``--set`` changes any fit argument). Each case trains its members from their
real ``fit`` lines (``lit.cli.run(..., run=False)``: the CLI's model and data for each seed) for ``--warmup``
untimed steps, then ``--steps`` timed ones; the cases take turns within each of ``--repeats`` rounds, so their ratios
share the machine's state (a shared machine's load moves them all), and each case's best round is reported. Seeds
per hour = 3600 · K / (seconds per step · the cell's steps): training only, the same validation and scoring
excluded from both. ``alone`` runs ``trainer.fit`` with ``--threads`` threads, in the place of one ``--jobs``
worker; ``--jobs N`` of them on N cores would train at most N times its rate. ``K = k`` is one process training k
seeds with ``--threads`` threads. The table names the machine, its threads and its load (``os.getloadavg``) at
the start and the end.

    python cli.py bench seeds [--preset cpu|gpu] [--ks 1 2 4 8 16] [--steps 5] [--threads 1]
"""
from __future__ import annotations

import argparse
import os
import tempfile
import time
from datetime import date
from pathlib import Path

import lightning as L
import torch

from ..utils.argtypes import doc_help
from ..utils.atomic import add_overwrite, output_folder, replacing_files, write_text
from ..utils.report import head, row
from .machine import apply_preset, describe, positive_int, sync

CELL = {"model.arch.attention.variant": "sa", "model.arch.n_layer": 2, "model.arch.attention.window": 16,
        "data.init_args.seq_len": 128, "model.arch.max_seq_len": 128, "trainer.max_steps": 600}
PRESETS = {
    "cpu": dict(ks=[1, 2, 4, 8, 16], steps=5, warmup=2, repeats=2, device="cpu"),
    # the GPU study preset's cell (configs/study/long_range.yaml, preset gpu: n = 512) at K up to 256
    "gpu": dict(ks=[1, 8, 32, 64, 128, 256], steps=10, warmup=3, repeats=2, device="cuda",
                sets=["data.init_args.seq_len=512", "model.arch.max_seq_len=512", "trainer.accelerator=gpu"]),
}


def fit_line(config: str, seed: int, sets: dict) -> list[str]:
    args = ["--config", config, "--seed_everything", str(seed), "--trainer.default_root_dir", tempfile.mkdtemp(),
            "--trainer.logger", "false", "--trainer.enable_checkpointing", "false", "--trainer.callbacks", "[]",
            "--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false",
            "--trainer.num_sanity_val_steps", "0", "--trainer.limit_val_batches", "0"]
    for key, value in sets.items():
        args += [f"--{key}", str(value)]
    return args


def members(config: str, sets: dict, k: int) -> list:
    from ..lit.cli import run as run_cli

    return [run_cli(fit_line(config, seed, sets), run=False) for seed in range(k)]


class _StepClock(L.Callback):
    """The seconds of the training steps after the first ``skip`` (``alone``'s timing inside Lightning's loop)."""

    def __init__(self, skip: int, device):
        self.skip, self.device, self.seconds, self.start = skip, device, 0.0, None

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if batch_idx == self.skip:
            sync(self.device)
            self.start = time.perf_counter()

    def on_train_end(self, trainer, pl_module):
        sync(self.device)
        self.seconds = time.perf_counter() - self.start


def time_alone(config: str, sets: dict, warmup: int, steps: int, device) -> float:
    """Seconds per step of one seed under ``trainer.fit`` (its Lightning loop, clipping and logging hooks)."""
    (cli,) = members(config, {**sets, "trainer.max_steps": warmup + steps}, 1)
    clock = _StepClock(warmup, device)
    cli.trainer.callbacks.append(clock)
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    return clock.seconds / steps


def time_ensemble(config: str, sets: dict, k: int, warmup: int, steps: int, device) -> float:
    """Seconds per step of k seeds as one ensemble (``lit.seeds.SeedEnsemble``), each on its own batches."""
    from lightning.fabric.utilities.apply_func import move_data_to_device

    from ..lit.seeds import SeedEnsemble, TrainSettings

    clis = members(config, sets, k)
    dms = [c.datamodule for c in clis]
    ensemble = SeedEnsemble([c.model.to(device) for c in clis], TrainSettings(int(clis[0].trainer.max_steps), 1.0),
                            dms[0].batch_size * dms[0].seq_len)
    loaders = [iter(dm.train_dataloader()) for dm in dms]
    for i in range(warmup + steps):
        if i == warmup:
            sync(device)
            start = time.perf_counter()
        ensemble.training_step([move_data_to_device(next(it), device) for it in loaders])
    sync(device)
    return (time.perf_counter() - start) / steps


def run(args) -> list[dict]:
    device = torch.device(args.device)
    sets = {**CELL, **dict(s.split("=", 1) for s in args.sets)}
    cell_steps = int(sets["trainer.max_steps"])
    timed_sets = {**sets, "trainer.max_steps": cell_steps}
    cases = [("alone", 1)] + [(f"K = {k}", k) for k in args.ks]
    best: dict[str, float] = {}
    for _ in range(args.repeats):
        for name, k in cases:
            seconds = time_alone(args.config, timed_sets, args.warmup, args.steps, device) if name == "alone" else \
                time_ensemble(args.config, timed_sets, k, args.warmup, args.steps, device)
            best[name] = min(best.get(name, float("inf")), seconds)
            print(f"{name}: {seconds * 1000:.0f} ms a step ({k} seed(s))", flush=True)
    base = best["alone"]
    return [{"case": name, "seeds": k, "ms_per_step": 1000 * best[name],
             "seeds_per_hour": 3600 * k / (best[name] * cell_steps),
             "vs_alone": (k / best[name]) / (1 / base)} for name, k in cases]


def markdown(rows: list[dict], args, loads: tuple) -> str:
    sets = {**CELL, **dict(s.split("=", 1) for s in args.sets)}
    lines = [f"# Training seeds per hour: each alone against K as one ensemble ({date.today().isoformat()})", "",
             f"Machine: {describe(args.device)}; load average {loads[0]:.2f} at the start, {loads[1]:.2f} at the "
             f"end (`os.getloadavg`, 1 min). Cell: `{args.config}` with "
             + ", ".join(f"`{k}={v}`" for k, v in sets.items())
             + f". {args.steps} timed steps after {args.warmup} untimed, best of {args.repeats} interleaved rounds.",
             "", *head(["case", "seeds", "ms a step", "seeds per hour (training)", "× alone"],
                       ["---", "---:", "---:", "---:", "---:"])]
    for r in rows:
        lines.append(row([r["case"], r["seeds"], f"{r['ms_per_step']:.0f}", f"{r['seeds_per_hour']:.1f}",
                          f"{r['vs_alone']:.2f}"]))
    return "\n".join(lines) + "\n"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="cli.py bench seeds", **doc_help(__doc__))
    p.add_argument("--preset", choices=PRESETS, default="cpu")
    p.add_argument("--config", default="configs/synthetic/passkey.yaml")
    p.add_argument("--ks", nargs="+", type=positive_int, default=None, help="ensemble sizes K to time")
    for key in ("steps", "warmup", "repeats"):
        p.add_argument(f"--{key}", type=positive_int, default=None)
    p.add_argument("--threads", type=positive_int, default=None,
                   help="torch threads for every case (default: torch's own)")
    p.add_argument("--set", dest="sets", action="append", default=None, metavar="KEY=VALUE",
                   help="a fit argument of the cell (repeatable), e.g. --set trainer.max_steps=800")
    p.add_argument("--out", type=output_folder, default="outputs/bench")
    add_overwrite(p)
    return p


def main(argv: list[str] | None = None) -> list[dict]:
    args = build_parser().parse_args(argv)
    preset_sets = PRESETS[args.preset].get("sets", [])
    apply_preset(args, {name: {k: v for k, v in p.items() if k != "sets"} for name, p in PRESETS.items()})
    args.sets = preset_sets + (args.sets or [])
    bad = [s for s in args.sets if "=" not in s]
    if bad:
        raise SystemExit(f"error: --set takes KEY=VALUE (a fit argument without its dashes), got {bad[0]!r}.")
    if not Path(args.config).is_file():
        raise SystemExit(f"error: --config {args.config} not found.")
    if args.threads:
        torch.set_num_threads(args.threads)
    loads = [os.getloadavg()[0]]
    rows = run(args)
    loads.append(os.getloadavg()[0])
    text = markdown(rows, args, tuple(loads))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with replacing_files(out, "benchmark", args.overwrite) as tmp:
        write_text(tmp / f"seeds_{args.preset}.md", text)
    print(text)
    return rows
