"""What every study shares: its settings (a YAML config, a preset, the command line), the ``cli.py fit`` line of a
cell, and the loop that trains the cells one by one, writing each to ``<out>/cells/<id>.json`` as it finishes and
skipping, on a rerun, every cell whose record was made with the same spec (so a killed study resumes)."""
from __future__ import annotations

import argparse
import copy
import json
import time
from pathlib import Path
from typing import Callable

import yaml

from ..utils.atomic import output_folder, write_text


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
    return settings


def parser(name: str, description: str, config: str, presets: str, folders: str) -> argparse.ArgumentParser:
    """A study's command line with what every study takes: ``--config``, ``--preset``, ``--set`` and ``--out``
    (``folders``: the default output folders, one per preset); the study adds its grid's flags."""
    parser = argparse.ArgumentParser(prog=f"cli.py study {name}", description=description)
    parser.add_argument("--config", default=config)
    parser.add_argument("--preset", help=f"a preset of the config: {presets}")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a fit argument for every cell, e.g. --set trainer.max_steps=100 (repeatable)")
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


def run_cells(cells: list[dict], out: Path, cell_id: Callable[[dict], str], spec_of: Callable[[dict], dict],
              run: Callable[[dict, dict], dict], line: Callable[[dict], str],
              loaded: Callable[[dict], dict] = lambda saved: saved) -> list[dict]:
    """Every cell's record, in order: the one on disk when its ``spec`` is this run's (``loaded`` turns it back
    from JSON), else ``run(cell, spec)``'s, written at once. One line per cell: its id, ``line(record)``, and the
    time it took and the study's so far."""
    (out / "cells").mkdir(parents=True, exist_ok=True)
    results, start = [], time.perf_counter()
    for i, cell in enumerate(cells, 1):
        path = out / "cells" / f"{cell_id(cell)}.json"
        spec = spec_of(cell)
        saved = read_cell(path)
        if saved.get("spec") == spec:
            result, status = loaded(saved), "done before"
        else:
            result = {**run(cell, spec), "spec": spec}
            write_text(path, json.dumps(result, indent=1))
            result, status = loaded(json.loads(json.dumps(result))), f"{result['seconds']:.0f} s"
        results.append(result)
        print(f"[{i}/{len(cells)}] {cell_id(cell)}: {line(result)} ({status}; "
              f"{time.perf_counter() - start:.0f} s so far)", flush=True)
    return results
