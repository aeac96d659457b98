"""``cli.py migrate OUT [OUT ...]``: bring the cell records in a folder written by an earlier version to today's
form, once, so that the code reads one form of record and keeps no branch for each earlier one.

    python cli.py migrate outputs/sweep/qwen3_8b

A sweep's records had these earlier forms. Each such record is rewritten atomically, under the folder's lock, where
its cell means the same today, and removed with its per-item records where it does not (the next run scores that
cell again, what a run did with it before):

- ``made_by`` beside the spec (2026-11-24 to 11-29, before ``fa41dde``): moved into the spec, where it is now;
- a spec without ``depth`` (before 2026-12-07, ``7976d39``): ``depth: null``, the patch as it ran, except for the
  deterministic controls that now tune their pattern for the model's depth (Strided+local and its union with SWA,
  Radix), whose records are removed;
- no ``sink`` (before sinks): sink 0, the masks it ran with;
- a ``made_by`` without the model's weights fingerprint (before 2026-11-27, ``491e73a``): nothing ties its scores to
  the model's bytes, so it is removed; so is a record without per-item records (before sweeps kept them), which has
  no intervals.

A record in a form this command does not know is left as it is: the next run scores its cell again. In an
evaluation's folder, its ``tb/`` (TensorBoard's scalars, which earlier versions wrote outside the set of files a run
replaces together) is recorded as the evaluation's own, so that the next run replaces it instead of refusing it as
the user's. A second migration changes nothing; a study's ``cells/`` has nothing to migrate. A sweep or an evaluation
that meets a folder of an earlier version refuses it in one line that names this command.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from .utils import runner
from .utils.argtypes import doc_help
from .utils.atomic import CELLS_KIND, record_written, write_text, written_by


#: the variants whose pattern depends on the model's depth since ``7976d39`` (``AttentionSpec.depth``): a record of
#: theirs from before ran another pattern
DEPTH_TUNED = ("strided_local", "strided_local_swa_union", "radix")


def migrate_record(record: dict) -> tuple[dict | None, str | None]:
    """A sweep record in today's form and what changed (the same dict and None where nothing did), or None and why it
    must run again."""
    from dataclasses import fields

    from .models.patcher import PatchSpec

    spec = record.get("spec")
    if not isinstance(spec, dict) or not {"mode", "task"} <= set(record):
        return record, None  # not a sweep's record
    if "items" not in record:
        return None, "no per-item records"
    new, spec = dict(record), dict(spec)
    if "made_by" in new:
        spec["made_by"] = new.pop("made_by")
    if not isinstance(spec.get("made_by"), dict) or "weights" not in spec["made_by"]:
        return None, "no weights fingerprint"
    if "depth" not in spec:
        if spec.get("variant") in DEPTH_TUNED:
            return None, "its pattern is tuned for the model's depth since"
        spec["depth"] = None
    spec.setdefault("sink", 0)
    new.setdefault("sink", spec["sink"])
    if set(spec) - {"made_by"} != {f.name for f in fields(PatchSpec)}:
        return record, None  # a form this command does not know: its cell runs again
    new["spec"] = spec
    return (record, None) if new == record else (new, "updated")


def migrate(out: Path) -> dict[str, list[str]]:
    """Migrate ``out``'s cells (``migrate_record``); returns the records' names by what was done: ``updated``,
    ``removed``."""
    cells = out / "cells"
    kind = cells / CELLS_KIND
    done: dict[str, list[str]] = {"updated": [], "removed": []}
    if not cells.is_dir():
        raise ValueError(f"{out} holds no cells/ folder: pass the --out of a sweep, a study or an evaluation.")
    kind = kind.read_text().strip() if kind.is_file() else None  # none: a sweep's from before 2026-11-27
    if kind == "evaluation" and (out / "tb").is_dir() and "tb" not in written_by(out):
        with runner.folder_lock(out, "migration"):
            record_written(out, ["tb"], "evaluation report")
        done["updated"].append("tb/")
    if kind not in (None, "sweep"):
        return done  # only a sweep's records have had earlier forms (``migrate_record`` knows them by their keys)
    with runner.folder_lock(out, "migration"):
        for path in sorted(cells.glob("*.json")):
            try:
                record = json.loads(path.read_text())
            except (OSError, ValueError):
                continue  # a damaged record runs again, as the runner says; nothing to migrate
            if not isinstance(record, dict):
                continue
            new, why = migrate_record(record)
            if new is None:
                runner.items_file(path).unlink(missing_ok=True)
                path.unlink()
                done["removed"].append(f"{path.name} ({why})")
            elif why:
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
