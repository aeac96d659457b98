"""Writing result rows: the one CSV writer of the analysis, benchmark and study commands."""
from __future__ import annotations

import csv
from pathlib import Path

from .atomic import replacing


def write_csv(path: Path, rows: list[dict], digits: int | None = None, fields: list[str] | None = None) -> None:
    """``rows`` as a CSV with a header, written atomically: ``fields`` (default: the first row's keys) are
    the columns, a row's other keys are left out; floats are rounded to ``digits`` when given."""
    if digits is not None:
        rows = [{k: (round(v, digits) if isinstance(v, float) else v) for k, v in r.items()} for r in rows]
    with replacing(path, "table") as tmp, tmp.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=fields or list(rows[0]), extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
