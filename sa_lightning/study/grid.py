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
from pathlib import Path
from typing import Callable

import yaml

from ..utils import runner
from ..utils.atomic import output_folder
from ..utils.quiet import quiet_lightning
from ..utils.runner import jobs_arg


def load_settings(path: str | Path, preset: str | None, overrides: dict, required: tuple[str, ...],
                  typed=None) -> dict:
    """The config file's top level, then its ``presets[preset]`` (or a second YAML file), then the command line's
    flags (those not None), checked against the study's config dataclass ``typed`` (each field's type, no unknown
    field); each key of ``required`` must hold at least one entry."""
    raw = yaml.safe_load(Path(path).read_text()) or {}
    presets = raw.pop("presets", {}) or {}
    settings = copy.deepcopy(raw)
    if preset:
        settings.update(runner.preset_values(presets, preset, str(path)))
    settings.update({k: v for k, v in overrides.items() if v is not None})
    if typed is not None:
        kept = runner.typed_settings(typed, settings, str(path) + (f" with preset {preset!r}" if preset else ""))
        settings = {k: v for k, v in kept.items() if k in settings}
    for key in required:
        if not settings.get(key):
            raise ValueError(f"the study needs at least one entry in {key!r} ({path}).")
    if settings.get("jobs") is not None:
        try:
            jobs_arg(settings["jobs"])
        except argparse.ArgumentTypeError as err:
            raise ValueError(f"jobs {err} ({path}).") from None
    return settings


def preset_names(config: str) -> list[str]:
    """The presets a study config defines, in its order (none where it cannot be read: help must not fail)."""
    try:
        return list((yaml.safe_load(Path(config).read_text()) or {}).get("presets") or {})
    except (OSError, yaml.YAMLError, AttributeError):
        return []


def parser(name: str, description: str, config: str, presets: str, folders: str) -> argparse.ArgumentParser:
    """A study's command line with what every study takes: ``--config``, ``--preset``, ``--set`` and ``--out``
    (``folders``: the default output folders, one per preset); the study adds its grid's flags."""
    parser = argparse.ArgumentParser(prog=f"cli.py study {name}", description=description)
    parser.add_argument("--config", default=config)
    parser.add_argument("--preset", help=f"a preset of the config ({presets}); the default config's: "
                                         f"{', '.join(preset_names(config)) or 'none found'}; its header says each")
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


def trained_checkpoint(saved: dict, spec: dict) -> dict | None:
    """What a cell's earlier run trained, when this run would train it the same way: the record ``saved`` was made
    with the same ``fit_args``, and the cell's folder (``--trainer.default_root_dir``) still holds a ``last.ckpt``
    at the step the record names. ``{"checkpoint", "steps", "train_seconds"}``, or None (train it)."""
    import torch

    args = [str(a) for a in spec.get("fit_args") or []]
    if not saved or not args or [str(a) for a in (saved.get("spec") or {}).get("fit_args") or []] != args \
            or "--trainer.default_root_dir" not in args[:-1] \
            or (saved.get("spec") or {}).get("inputs", spec.get("inputs")) != spec.get("inputs"):
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
    if "--trainer.default_root_dir" in args[:-1]:  # a line every 30 s from the quiet fit (not in the spec: no retrain)
        label = Path(args[args.index("--trainer.default_root_dir") + 1]).name
        args.append("--trainer.callbacks+=" + json.dumps({"class_path": "sa_lightning.lit.callbacks.Heartbeat",
                                                           "init_args": {"label": label}}))
    cli = run_cli(args, run=True)
    seconds = trained["train_seconds"] if trained and trained.get("train_seconds") is not None \
        else time.perf_counter() - start
    return cli, float(seconds)


def _quiet_fit() -> None:
    """A worker's start: the command line's quiet output for ``fit``, and no progress bars (lm-eval's, the
    datasets'): several workers' bars share the terminal with the runner's lines, which they would cut into."""
    os.environ["TQDM_DISABLE"] = "1"
    quiet_lightning("fit")


def run_cells(cells: list[dict], out: Path, cell_id: Callable[[dict], str], spec_of: Callable[[dict], dict],
              run: Callable[[dict, dict], dict], line: Callable[[dict], str],
              loaded: Callable[[dict], dict] = lambda saved: saved, jobs: int | str | None = 1) -> list[dict]:
    """The study's cells through the one runner (``utils.runner.run_cells``): a cell whose record holds this
    run's spec is reused; one whose earlier record was made with the same ``fit`` arguments but other scoring
    settings is scored again from its last checkpoint (``trained_checkpoint``), not trained."""
    def given(cell: dict, saved: dict, spec: dict) -> dict:
        trained = trained_checkpoint(saved, spec)
        if trained is None:
            return spec
        print(f"{cell_id(cell)}: trained before with the same fit arguments; scored again from its last "
              "checkpoint, not trained", flush=True)
        return {**spec, "trained": trained}

    def spec_with_inputs(cell: dict) -> dict:
        spec = spec_of(cell)
        inputs = config_fingerprint(spec.get("fit_args") or [])
        return spec if inputs is None else {**spec, "inputs": inputs}

    def reuse(saved: dict, spec: dict) -> bool:
        """The same spec; or, for a record written before specs named their config's fingerprint, the same spec
        but that (its fit arguments name the same config file, whose bytes it did not record)."""
        kept = saved.get("spec") or {}
        return kept == spec or ("inputs" not in kept and kept == {k: v for k, v in spec.items() if k != "inputs"})

    return runner.run_cells(cells, out, cell_id, spec_with_inputs, run, line, loaded, jobs, given=given,
                            setup=_quiet_fit, needs="scores", kind="study", announce=True, reuse=reuse)


def config_fingerprint(args: list) -> str | None:
    """The fingerprint of every file a cell's ``fit`` line names: its ``--config``, and any argument whose value is a
    file (``--model.init_weights FILE``, ``--set model.init_weights=FILE``), each by its bytes: a cell trained from a
    file since replaced is trained again, not reused because its path is the same. A line whose only file is its
    config keeps that file's fingerprint alone."""
    args = [str(a) for a in args]
    config = args[args.index("--config") + 1] if "--config" in args[:-1] else None
    named = [a.split("=", 1)[1] if a.startswith("--") and "=" in a else a for a in args]
    others = sorted({v for v in named if v != config and not v.startswith("--") and Path(v).is_file()})
    first = runner.fingerprint(config) if config and Path(config).is_file() else None
    if not others:
        return first
    return ";".join([first or "", *(f"{v}={runner.fingerprint(v)}" for v in others)])
