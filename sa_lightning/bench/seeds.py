"""``cli.py bench seeds``: training seeds per hour of one cell, each seed alone (today's ``cli.py fit``, Lightning's
loop) against K seeds as one ensemble (``lit.seeds``), side by side on this machine.

The cell is the pass-key task's (``configs/synthetic/passkey.yaml`` with the long-range study's powered cell:
n = 128, L = 2, w = 16, 600 steps; ``--set`` changes any fit argument). Each case trains its members from their
real ``fit`` lines (``lit.cli.run(..., run=False)``: the CLI's model and data for each seed) for ``--warmup``
untimed steps, then ``--steps`` timed ones; the cases take turns within each of ``--repeats`` rounds, and each case's
ratio to alone is taken within a round, so that a shared machine's drifting load moves both sides of it; the table
gives the medians over the rounds. Seeds
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
import statistics
import tempfile
import time
from datetime import date
from pathlib import Path

import lightning as L
import torch

from ..utils.argtypes import doc_help, key_values, preset_help
from ..utils.atomic import add_overwrite, output_folder, replacing_files, write_text
from ..utils.report import head, row
from .machine import apply_preset, describe, positive_int, sync

CELL = {"model.arch.attention.variant": "sa", "model.arch.n_layer": 2, "model.arch.attention.window": 16,
        "data.init_args.seq_len": 128, "model.arch.max_seq_len": 128, "trainer.max_steps": 600}
PRESETS = {
    "cpu": dict(ks=[1, 2, 4, 8, 16], steps=3, warmup=1, repeats=5, device="cpu"),
    # the GPU study preset's cell (configs/study/long_range.yaml, preset gpu: n = 512, w = 32, bf16-mixed), K to 256
    "gpu": dict(ks=[1, 8, 32, 64, 128, 256], steps=10, warmup=3, repeats=3, device="cuda",
                sets=["data.init_args.seq_len=512", "model.arch.max_seq_len=512", "model.arch.attention.window=32",
                      "trainer.accelerator=gpu", "trainer.precision=bf16-mixed"]),
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


class Ensemble:
    """k seeds as one ensemble (``lit.seeds.SeedEnsemble``), each on its own batches, kept across rounds."""

    def __init__(self, config: str, sets: dict, k: int, device):
        from ..lit.seeds import SeedEnsemble, TrainSettings

        clis = members(config, sets, k)
        dms = [c.datamodule for c in clis]
        settings = TrainSettings.of(clis[0].trainer, 1)  # its clipping and precision, as the cell's fit
        self.ensemble = SeedEnsemble([c.model.to(device) for c in clis], settings, dms[0].batch_size * dms[0].seq_len)
        self.loaders, self.device = [iter(dm.train_dataloader()) for dm in dms], device

    def seconds_per_step(self, warmup: int, steps: int) -> float:
        from lightning.fabric.utilities.apply_func import move_data_to_device

        for i in range(warmup + steps):
            if i == warmup:
                sync(self.device)
                start = time.perf_counter()
            self.ensemble.training_step([move_data_to_device(next(it), self.device) for it in self.loaders])
        sync(self.device)
        return (time.perf_counter() - start) / steps


def run(args) -> list[dict]:
    """Every case's seconds a step in each round (alone first), and per case the medians over the rounds: of its
    seconds a step, and of its seeds a second over alone's in the same round (the ratio a shared machine's drifting
    load moves least)."""
    device = torch.device(args.device)
    sets = {**CELL, **key_values(args.sets)}
    cell_steps = int(sets["trainer.max_steps"])
    ensembles = {k: Ensemble(args.config, sets, k, device) for k in args.ks}
    rounds: list[dict] = []
    for r in range(args.repeats):
        warmup = args.warmup if r == 0 else 0  # the ensembles' first steps; alone is a new fit each round
        seconds = {"alone": time_alone(args.config, sets, args.warmup, args.steps, device)}
        for k, ensemble in ensembles.items():
            seconds[k] = ensemble.seconds_per_step(warmup, args.steps)
        rounds.append(seconds)
        print(f"round {r + 1}/{args.repeats}: " + ", ".join(
            f"{'alone' if k == 'alone' else f'K = {k}'} {1000 * s:.0f} ms" for k, s in seconds.items()), flush=True)
    out = []
    for key, k in [("alone", 1)] + [(k, k) for k in args.ks]:
        per_step = statistics.median(r[key] for r in rounds)
        out.append({"case": "alone" if key == "alone" else f"K = {k}", "seeds": k, "ms_per_step": 1000 * per_step,
                     "seeds_per_hour": 3600 * k / (per_step * cell_steps),
                     "vs_alone": statistics.median(k * r["alone"] / r[key] for r in rounds),
                     "vs_alone_range": (min(k * r["alone"] / r[key] for r in rounds),
                                        max(k * r["alone"] / r[key] for r in rounds))})
    return out


def markdown(rows: list[dict], args, loads: tuple) -> str:
    sets = {**CELL, **key_values(args.sets)}
    lines = [f"# Training seeds per hour: each alone against K as one ensemble ({date.today().isoformat()})", "",
             f"Machine: {describe(args.device)}; load average {loads[0]:.2f} at the start, {loads[1]:.2f} at the "
             f"end (`os.getloadavg`, 1 min). Cell: `{args.config}` with "
             + ", ".join(f"`{k}={v}`" for k, v in sets.items())
             + f". {args.repeats} rounds, each timing every case for {args.steps} steps in turn (after {args.warmup} "
               "untimed steps); the medians over the rounds, and × alone: the case's seeds a second over alone's in "
               "the same round (median, and its range over the rounds).",
             "", *head(["case", "seeds", "ms a step (median)", "seeds per hour (training)", "× alone [range]"],
                       ["---", "---:", "---:", "---:", "---:"])]
    for r in rows:
        lo, hi = r["vs_alone_range"]
        lines.append(row([r["case"], r["seeds"], f"{r['ms_per_step']:.0f}", f"{r['seeds_per_hour']:.1f}",
                          f"{r['vs_alone']:.2f} [{lo:.2f}, {hi:.2f}]"]))
    return "\n".join(lines) + "\n"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="cli.py bench seeds", **doc_help(__doc__))
    p.add_argument("--preset", choices=PRESETS, default="cpu",
                   help="the sizes below at once: cpu (on a CPU) or gpu (the GPU study preset's cell, K up to 256); "
                        "a flag given wins over its preset")
    p.add_argument("--config", default="configs/synthetic/passkey.yaml", help="the fit config of the cell")
    p.add_argument("--ks", nargs="+", type=positive_int, default=None,
                   help=preset_help("ensemble sizes K to time", PRESETS, "ks"))
    for key, text in (("steps", "timed steps of each case per round"),
                      ("warmup", "untimed steps before a case's first timed ones"),
                      ("repeats", "rounds in which the cases take turns; the table shows their medians")):
        p.add_argument(f"--{key}", type=positive_int, default=None, help=preset_help(text, PRESETS, key))
    p.add_argument("--threads", type=positive_int, default=None,
                   help="torch threads for every case (default: torch's own)")
    p.add_argument("--set", dest="sets", action="append", default=None, metavar="KEY=VALUE",
                   help="a fit argument of the cell (repeatable), e.g. --set trainer.max_steps=800 (default: "
                        "none; the gpu preset sets its cell's length, window and precision)")
    p.add_argument("--out", type=output_folder, default="outputs/bench", help="the folder of seeds_<preset>.md")
    add_overwrite(p)
    return p


def main(argv: list[str] | None = None) -> list[dict]:
    args = build_parser().parse_args(argv)
    preset_sets = PRESETS[args.preset].get("sets", [])
    apply_preset(args, {name: {k: v for k, v in p.items() if k != "sets"} for name, p in PRESETS.items()})
    args.sets = preset_sets + (args.sets or [])
    key_values(args.sets)  # each KEY=VALUE, checked before anything trains
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
