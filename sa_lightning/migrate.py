"""``cli.py migrate OUT [OUT ...]``: bring the cell records in a folder written by an earlier version to today's
form, once, so that the code reads one form of record and keeps no branch for each earlier one.

    python cli.py migrate outputs/sweep/smollm2_135m

What it changes, in a sweep's ``cells/`` (each record rewritten atomically, under the folder's lock):

- a record from before sinks (no ``sink``): sink 0, the masks it ran with, in the record and its spec;
- a record from before the model's weights were fingerprinted (its spec's ``made_by`` names no ``weights``): nothing
  ties its scores to the model's bytes, so it is removed with its per-item records, and the next run scores that
  cell again (what a run did with it before this command existed).

In an evaluation's folder, its ``tb/`` (TensorBoard's scalars, which earlier versions wrote outside the set of files
a run replaces together) is recorded as the evaluation's own, so that the next run replaces it instead of refusing
it as the user's.

A record already in today's form is left as it is, so a second migration changes nothing; a study's ``cells/`` has
nothing to migrate. A sweep that meets an unmigrated record refuses its folder and names this command.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from .utils import runner
from .utils.argtypes import doc_help
from .utils.atomic import CELLS_KIND, record_written, write_text, written_by


def migrate_record(record: dict) -> dict | None:
    """A sweep record in today's form (the same dict where nothing changes), or None where it must run again."""
    spec = record.get("spec")
    if not isinstance(spec, dict):
        return record
    made = spec.get("made_by")
    if isinstance(made, dict) and "weights" not in made:
        return None
    if "sink" in record and "sink" in spec:
        return record
    return {**record, "sink": record.get("sink", 0), "spec": {**spec, "sink": spec.get("sink", 0)}}


def migrate(out: Path) -> dict[str, list[str]]:
    """Migrate ``out``'s cells (``migrate_record``); returns the records' names by what was done: ``updated``,
    ``removed``."""
    cells = out / "cells"
    kind = cells / CELLS_KIND
    done: dict[str, list[str]] = {"updated": [], "removed": []}
    if not cells.is_dir():
        raise ValueError(f"{out} holds no cells/ folder: pass the --out of a sweep, a study or an evaluation.")
    kind = kind.read_text().strip() if kind.is_file() else None
    if kind == "evaluation" and (out / "tb").is_dir() and "tb" not in written_by(out):
        with runner.folder_lock(out, "migration"):
            record_written(out, ["tb"], "evaluation report")
        done["updated"].append("tb/")
    if kind != "sweep":
        return done  # only a sweep's records have had earlier forms
    with runner.folder_lock(out, "migration"):
        for path in sorted(cells.glob("*.json")):
            try:
                record = json.loads(path.read_text())
            except (OSError, ValueError):
                continue  # a damaged record runs again, as the runner says; nothing to migrate
            if not isinstance(record, dict):
                continue
            new = migrate_record(record)
            if new is None:
                runner.items_file(path).unlink(missing_ok=True)
                path.unlink()
                done["removed"].append(path.name)
            elif new is not record:
                write_text(path, json.dumps(new, indent=1))
                done["updated"].append(path.name)
    return done


def main(argv: list[str] | None = None) -> dict[str, dict[str, list[str]]]:
    parser = argparse.ArgumentParser(prog="cli.py migrate", **doc_help(__doc__))
    parser.add_argument("out", nargs="+", type=Path, help="a run's output folder (its --out), holding cells/")
    args = parser.parse_args(argv)
    made = {}
    for out in args.out:
        done = made[str(out)] = migrate(out)
        said = [f"{len(names)} {what}" for what, names in done.items() if names]
        print(f"{out}: " + ("; ".join(said) + (f" (removed, to run again: {', '.join(done['removed'])})"
                                               if done["removed"] else "") if said else "nothing to migrate"))
    return made
