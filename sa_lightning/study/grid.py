"""What every study shares: its settings (a YAML config, a preset, the command line), the ``cli.py fit`` line of a
cell, and the loop that trains the cells, one by one or ``jobs`` at a time in worker processes, writing each to
``<out>/cells/<id>.json`` as it finishes and skipping, on a rerun, every cell whose record was made with the same
spec (so a killed study resumes). A cell whose record was made with the same ``fit`` arguments but other scoring
settings (more σ seeds at evaluation, say) is not trained again: its model comes back from its last checkpoint
(``trained_checkpoint``) and only the scoring runs."""
from __future__ import annotations

import argparse
import copy
import json
import os
import time
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from multiprocessing import get_context
from pathlib import Path
from typing import Callable

import yaml

from ..utils.atomic import output_folder, write_text
from ..utils.load import cores_available
from ..utils.quiet import quiet_lightning


def load_settings(path: str | Path, preset: str | None, overrides: dict, required: tuple[str, ...]) -> dict:
    """The config file's top level, then its ``presets[preset]``, then the command line's flags (those not None);
    each key of ``required`` must hold at least one entry."""
    raw = yaml.safe_load(Path(path).read_text()) or {}
    presets = raw.pop("presets", {}) or {}
    settings = copy.deepcopy(raw)
    if preset:
        if preset not in presets:
            raise ValueError(f"unknown preset {preset!r}; {path} has {', '.join(presets) or 'none'}.")
        settings.update(presets[preset])
    settings.update({k: v for k, v in overrides.items() if v is not None})
    for key in required:
        if not settings.get(key):
            raise ValueError(f"the study needs at least one entry in {key!r} ({path}).")
    if settings.get("jobs") is not None:
        try:
            jobs_arg(settings["jobs"])
        except argparse.ArgumentTypeError as err:
            raise ValueError(f"jobs {err} ({path}).") from None
    return settings


def parser(name: str, description: str, config: str, presets: str, folders: str) -> argparse.ArgumentParser:
    """A study's command line with what every study takes: ``--config``, ``--preset``, ``--set`` and ``--out``
    (``folders``: the default output folders, one per preset); the study adds its grid's flags."""
    parser = argparse.ArgumentParser(prog=f"cli.py study {name}", description=description)
    parser.add_argument("--config", default=config)
    parser.add_argument("--preset", help=f"a preset of the config: {presets}")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a fit argument for every cell, e.g. --set trainer.max_steps=100 (repeatable)")
    parser.add_argument("--jobs", type=jobs_arg,
                        help="cells trained at once, each in its own process with cores/jobs threads (default: the "
                             "config's jobs, else auto: one per CPU core without a GPU, one with a GPU)")
    parser.add_argument("--out", type=output_folder,
                        help=f"output folder (default: the config's out, one per preset so that a quick run never "
                             f"overwrites the full study: {folders})")
    return parser


def add_sets(settings: dict, sets: list[str]) -> None:
    """``--set KEY=VALUE`` (repeatable): a ``cli.py fit`` argument for every cell, into ``fit_overrides``."""
    for item in sets:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SystemExit(f"error: --set takes KEY=VALUE (a fit argument without its dashes), got {item!r}.")
        settings["fit_overrides"] = {**(settings.get("fit_overrides") or {}), key: value}


def fit_args(config: str, swaps: dict, settings: dict, folder: Path) -> list[str]:
    """The ``cli.py fit`` command line of one cell: ``config`` with the cell's ``swaps`` (variant, window, seed,
    ...), then the study's ``fit_overrides``, quiet, under ``folder``."""
    args = ["fit", "--config", config]
    for key, value in {**swaps, "trainer.default_root_dir": folder, "trainer.enable_progress_bar": "false",
                       "trainer.enable_model_summary": "false", **(settings.get("fit_overrides") or {})}.items():
        args += [f"--{key}", str(value)]
    return args


def read_cell(path: Path) -> dict:
    """A finished cell's record, or {} (run it) when there is none or it is damaged: a file cut short by a
    kill (before cells were written atomically) is run again, with one line saying so."""
    if not path.is_file():
        return {}
    try:
        saved = json.loads(path.read_text())
        if isinstance(saved, dict) and isinstance(saved.get("scores"), dict):
            return saved
    except (ValueError, UnicodeDecodeError):
        pass
    print(f"{path} is damaged (cut short?); running that cell again", flush=True)
    return {}


def trained_checkpoint(saved: dict, spec: dict) -> dict | None:
    """What a cell's earlier run trained, when this run would train it the same way: the record ``saved`` was made
    with the same ``fit_args``, and the cell's folder (``--trainer.default_root_dir``) still holds a ``last.ckpt``
    at the step the record names. ``{"checkpoint", "steps", "train_seconds"}``, or None (train it)."""
    import torch

    args = [str(a) for a in spec.get("fit_args") or []]
    if not saved or not args or [str(a) for a in (saved.get("spec") or {}).get("fit_args") or []] != args \
            or "--trainer.default_root_dir" not in args[:-1]:
        return None
    folder = Path(args[args.index("--trainer.default_root_dir") + 1])
    found = sorted(folder.glob("tb/version_*/checkpoints/last.ckpt"), key=lambda p: p.stat().st_mtime)
    if not found:
        return None
    try:
        # memory-mapped: only the step is read, not a large model's weights and optimizer state
        step = torch.load(found[-1], map_location="cpu", weights_only=True, mmap=True).get("global_step")
    except Exception:  # a damaged checkpoint: train again
        return None
    if step is None or step != saved.get("steps"):
        return None
    return {"checkpoint": str(found[-1]), "steps": int(step), "train_seconds": saved.get("train_seconds")}


def fit_cell(spec: dict):
    """``cli.py fit`` with the spec's ``fit_args`` (a cell's trained model: the CLI, its model and data), and the
    seconds it trained. With ``spec["trained"]`` (``trained_checkpoint``) the fit resumes from that checkpoint,
    already at its last step, so nothing trains and the seconds are the earlier run's."""
    from ..lit.cli import run as run_cli

    start = time.perf_counter()
    trained = spec.get("trained")
    args = list(spec["fit_args"]) + (["--ckpt_path", trained["checkpoint"]] if trained else [])
    cli = run_cli(args, run=True)
    seconds = trained["train_seconds"] if trained and trained.get("train_seconds") is not None \
        else time.perf_counter() - start
    return cli, float(seconds)


def jobs_arg(text: str) -> int | str:
    """``--jobs``: a count >= 1, or ``auto``."""
    if str(text) == "auto":
        return "auto"
    if not str(text).isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"takes a count >= 1 or 'auto', got {text!r}")
    return int(text)


def plan_jobs(jobs: int | str | None, pending: int) -> tuple[int, int]:
    """(processes, threads each) for ``pending`` cells. ``auto`` (the default): one cell per core on a machine
    without a GPU, where a small model trains faster on one thread per process than on all of them in one (the
    pretrain study: 24 cells in 51 min as two one-thread processes on 2 cores, where the cells' one-thread times
    add up to about 1 h 42 min); one process where a GPU is, as its cells would share it."""
    jobs = jobs_arg(jobs if jobs is not None else "auto")
    if jobs == "auto":
        import torch

        jobs = 1 if torch.cuda.is_available() else cores_available()
    jobs = max(1, min(jobs, pending))
    return jobs, max(1, cores_available() // jobs)


def _start_worker(threads: int) -> None:
    """A worker's start: its share of the cores (and the processes it starts, through ``OMP_NUM_THREADS``, which
    also tells ``utils.load`` that the count was chosen), and the command line's quiet output."""
    os.environ["OMP_NUM_THREADS"] = str(threads)
    import torch

    torch.set_num_threads(threads)
    quiet_lightning("fit")


def run_cells(cells: list[dict], out: Path, cell_id: Callable[[dict], str], spec_of: Callable[[dict], dict],
              run: Callable[[dict, dict], dict], line: Callable[[dict], str],
              loaded: Callable[[dict], dict] = lambda saved: saved, jobs: int | str | None = 1) -> list[dict]:
    """Every cell's record, in order: the one on disk when its ``spec`` is this run's (``loaded`` turns it back
    from JSON), else ``run(cell, spec)``'s, written as soon as it finishes. With ``jobs`` > 1 (or ``auto``,
    ``plan_jobs``) the cells to run go to that many worker processes (``run`` must then be a module-level
    function); a cell that fails stops the study once the cells in flight are written. One line per cell as it
    finishes: its place in the grid, its id, ``line(record)``, the time it took and the study's so far."""
    (out / "cells").mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    results: dict[int, dict] = {}
    todo = []

    def finish(i: int, cell: dict, result: dict, status: str) -> None:
        results[i] = result
        print(f"[{i}/{len(cells)}] {cell_id(cell)}: {line(result)} ({status}; "
              f"{time.perf_counter() - start:.0f} s so far)", flush=True)

    def keep(i: int, cell: dict, path: Path, record: dict) -> None:
        write_text(path, json.dumps(record, indent=1))
        finish(i, cell, loaded(json.loads(json.dumps(record))), f"{record['seconds']:.0f} s")

    rescored = 0
    for i, cell in enumerate(cells, 1):
        path, spec = out / "cells" / f"{cell_id(cell)}.json", spec_of(cell)
        saved = read_cell(path)
        if saved.get("spec") == spec:
            finish(i, cell, loaded(saved), "done before")
        else:
            trained = trained_checkpoint(saved, spec)
            rescored += trained is not None
            todo.append((i, cell, path, spec, {**spec, "trained": trained} if trained else spec))
    if rescored:
        print(f"{rescored} cell(s) trained before with the same fit arguments: scored again from their last "
              f"checkpoints, not trained", flush=True)
    processes, threads = plan_jobs(jobs, len(todo))
    if processes == 1:
        for i, cell, path, spec, given in todo:
            keep(i, cell, path, {**run(cell, given), "spec": spec})
        return [results[i] for i in sorted(results)]
    print(f"{len(todo)} cell(s) to run, {processes} at a time ({threads} thread(s) each)", flush=True)
    with ProcessPoolExecutor(processes, mp_context=get_context("spawn"), initializer=_start_worker,
                             initargs=(threads,)) as pool:
        running = {pool.submit(run, cell, given): (i, cell, path, spec) for i, cell, path, spec, given in todo}
        failed = None
        while running:
            done, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in done:
                i, cell, path, spec = running.pop(future)
                if future.cancelled():
                    continue
                if future.exception() is not None:
                    if failed is None:  # the rest never start; the ones in flight still finish and are kept
                        failed = future.exception()
                        for other in running:
                            other.cancel()
                    continue
                keep(i, cell, path, {**future.result(), "spec": spec})
        if failed is not None:
            raise failed
    return [results[i] for i in sorted(results)]
