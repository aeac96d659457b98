"""Markdown tables in the paper's layout: best in bold, second best underlined, accuracies in %."""
from __future__ import annotations

import math

from ..utils.report import head, ranked_cells, row, score
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


def markdown_table(rows: dict[str, dict[str, dict[str, float]]], columns: tuple[Column, ...],
                   first: str = "Model") -> str:
    """``rows`` maps a row label (a checkpoint, a variant) to its ``{task: {metric: value}}``."""
    labels = list(rows)
    grid = [cell_values(rows[label], columns) for label in labels]
    headers = [f"{c.label} ↓" if c.lower_is_better else c.label for c in columns] + ["Avg."]
    lower = [c.lower_is_better for c in columns] + [False]
    marked = [ranked_cells([g[j] for g in grid], [score(g[j], lower[j]) for g in grid], lower[j])
              for j in range(len(headers))]
    lines = head([first, *headers])
    lines += [row([label, *(column[i] for column in marked)]) for i, label in enumerate(labels)]
    return "\n".join(lines) + "\n"
