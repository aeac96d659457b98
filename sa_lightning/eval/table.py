"""Markdown tables in the paper's layout: best in bold, second best underlined, accuracies in %."""
from __future__ import annotations

import math

from .harness import Column


def cell_values(metrics: dict[str, dict[str, float]], columns: tuple[Column, ...]) -> list[float | None]:
    """One number per column (accuracies in %) plus the average of the accuracy columns."""
    values = []
    for col in columns:
        v = metrics.get(col.task, {}).get(col.metric)
        values.append(None if v is None or (isinstance(v, float) and math.isnan(v)) else
                      v * 100 if col.is_accuracy else v)
    accs = [v for c, v in zip(columns, values) if c.is_accuracy and v is not None]
    values.append(sum(accs) / len(accs) if accs else None)
    return values


def ranks(column: list[float | None], lower_is_better: bool = False) -> dict[int, int]:
    """Row index -> 0 (best) or 1 (second best); ties share the better rank."""
    present = sorted({v for v in column if v is not None}, reverse=not lower_is_better)
    best = present[:2]
    return {i: best.index(v) for i, v in enumerate(column) if v is not None and v in best}


def emphasize(text: str, rank: int | None) -> str:
    """The paper's marks: best in bold, second best underlined."""
    return f"**{text}**" if rank == 0 else f"<u>{text}</u>" if rank == 1 else text


def markdown_table(rows: dict[str, dict[str, dict[str, float]]], columns: tuple[Column, ...],
                   first: str = "Model") -> str:
    """``rows`` maps a row label (a checkpoint, a variant) to its ``{task: {metric: value}}``."""
    labels = list(rows)
    grid = [cell_values(rows[label], columns) for label in labels]
    headers = [f"{c.label} ↓" if c.lower_is_better else c.label for c in columns] + ["Avg."]
    lower = [c.lower_is_better for c in columns] + [False]
    marks = [ranks([g[j] for g in grid], lower[j]) if len(grid) > 1 else {} for j in range(len(headers))]
    lines = [f"| {first} | " + " | ".join(headers) + " |", "|---|" + "---|" * len(headers)]
    for i, label in enumerate(labels):
        cells = []
        for j, value in enumerate(grid[i]):
            text = "–" if value is None else f"{value:.2f}" if lower[j] else f"{value:.1f}"
            cells.append(emphasize(text, marks[j].get(i)))
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
