"""Writing result rows: the one CSV writer of the analysis, benchmark and study commands."""
from __future__ import annotations

import csv
from pathlib import Path


def write_csv(path: Path, rows: list[dict], digits: int | None = None) -> None:
    """``rows`` (dicts sharing the first row's keys) as a CSV with a header; floats rounded to ``digits``
    when given."""
    if digits is not None:
        rows = [{k: (round(v, digits) if isinstance(v, float) else v) for k, v in r.items()} for r in rows]
    with Path(path).open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
