"""What every table and figure of the package shares: task labels, the matplotlib set-up and the markdown
tables in the paper's style (best in bold, second best underlined). A variant's label, colour and marker live
in its own file (``attention/variants/``): ``get_variant(name).color``, ``attention.variant_label``.

Figures are saved through ``save_figure`` (atomically, then closed) and CSVs written through
``utils.tables.write_csv``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

#: the short column names of the sweep tables (Tables 4-5)
TASK_LABELS = {"hellaswag": "Hella.", "mmlu": "MMLU", "arc_challenge": "ARC-C", "boolq": "BoolQ",
               "lambada_openai": "LMB", "arc_easy": "ARC-E", "humaneval": "HuEval", "humaneval_exec": "HuEval",
               "shakespeare_lastword": "LW", "shakespeare_choice": "MC", "passkey_512": "PK-512",
               "passkey_1k": "PK-1k", "passkey_2k": "PK-2k", "passkey_4k": "PK-4k"}

MISSING = "–"


# ---- labels ---------------------------------------------------------------------------------------
def task_label(task: str, ppl_context: int | None = None) -> str:
    """A task's column name; ``ppl_context``: the context of a perplexity-by-position task (``PPL@4k``)."""
    if ppl_context is not None:
        return f"PPL@{ppl_context // 1024}k" if ppl_context % 1024 == 0 else f"PPL@{ppl_context}"
    return TASK_LABELS.get(task, task)


# ---- figures --------------------------------------------------------------------------------------
def pyplot():
    """``matplotlib.pyplot`` on the file-only Agg backend (no display is needed, none is opened)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, path, **kwargs) -> None:
    """Write ``fig`` to ``path`` atomically (``utils.atomic.savefig``: the format from the suffix), then close it,
    also when the write fails: a process that draws on (``analyze all``, a sweep, a test) keeps no figure open."""
    from . import atomic  # looked up at the call: one name to patch for every figure of the package

    try:
        atomic.savefig(fig, path, **kwargs)
    finally:
        pyplot().close(fig)


def spread(count: int, octaves: float) -> list[float]:
    """The factor on a log-x axis of each of ``count`` series, so that their markers at one x sit side by side
    instead of on top of each other: 2**offset, the offsets spread evenly over ``octaves`` around 0."""
    return [2 ** (octaves * (i / (count - 1) - 0.5)) if count > 1 else 1.0 for i in range(count)]


def power_of_two_ticks(ax, values) -> None:
    """Ticks at exactly ``values`` on a log-x axis, written out (``2048``, ``16k``), the minor ticks off: the
    default ``2×10^3, 3×10^3, 4×10^3`` labels of a short log axis run into each other."""
    from matplotlib.ticker import NullLocator

    values = sorted(set(values))
    ax.set_xticks(values, [f"{v // 1024}k" if v >= 1024 and v % 1024 == 0 else f"{v:g}" for v in values])
    ax.xaxis.set_minor_locator(NullLocator())  # the y axis keeps its minor ticks


# ---- markdown tables ------------------------------------------------------------------------------
def fmt(value: float, spec: str) -> str:
    """``format(value, spec)`` with no negative zero: a value that rounds to zero prints as 0 (+0 where ``spec``
    signs), never as -0.0."""
    text = format(value, spec)
    if text.startswith("-") and not any(c in "123456789" for c in text.split("e")[0]):
        text = ("+" if "+" in spec else "") + text[1:]
    return text


def number(value: float | None, spec: str) -> str:
    """``format(value, spec)`` for a table cell, or "–" for a value that is missing (None) or not a number."""
    return MISSING if value is None or value != value else fmt(value, spec)


def score(value: float | None, lower_is_better: bool = False) -> str:
    """A score cell: perplexities (lower is better) to 2 decimals, accuracies (%) to 1, "–" when missing."""
    return number(value, ".2f" if lower_is_better else ".1f")


def ranks(column: list[float | None], lower_is_better: bool = False, top: int = 2) -> dict[int, int]:
    """Row index -> 0 (best), 1 (second best), ... up to ``top`` places; ties share the better rank, missing
    values (None, NaN) rank nowhere."""
    present = sorted({v for v in column if v is not None and v == v}, reverse=not lower_is_better)
    best = present[:top]
    return {i: best.index(v) for i, v in enumerate(column) if v is not None and v in best}


def emphasize(text: str, rank: int | None) -> str:
    """The paper's marks: best in bold, second best underlined."""
    return f"**{text}**" if rank == 0 else f"<u>{text}</u>" if rank == 1 else text


def ranked_cells(values: list[float | None], texts: list[str], lower_is_better: bool = False, top: int = 2,
                 rank_alone: bool = False) -> list[str]:
    """``texts`` (one per row of a column) marked by the rank of ``values``; a single row is marked only with
    ``rank_alone``."""
    marks = ranks(values, lower_is_better, top) if rank_alone or len(values) > 1 else {}
    return [emphasize(text, marks.get(i)) for i, text in enumerate(texts)]


def cell_text(value) -> str:
    """A value as one markdown table cell: a ``|`` escaped and line breaks as spaces, so that a user's label
    never splits a row or the table."""
    return " ".join(str(value).replace("|", "\\|").split()) if any(c in str(value) for c in "|\r\n") else str(value)


def row(cells) -> str:
    """One markdown table row."""
    return "| " + " | ".join(cell_text(c) for c in cells) + " |"


def head(names, align: str | list[str] = "---") -> list[str]:
    """A markdown header and its rule; ``align`` is one rule for every column (``---``, ``---:``) or one each."""
    names = list(names)
    rules = [align] * len(names) if isinstance(align, str) else align
    return [row(names), "|" + "".join(f"{r}|" for r in rules)]


@dataclass(frozen=True)
class Column:
    """One column of an A − B table: its header, its rule (``---``, ``---:``) and its cell from a comparison row."""

    name: str
    cell: Callable[[dict], object]
    align: str = "---"


def ab_table(rows: list[dict], columns: list[Column]) -> list[str]:
    """The one A − B writer: markdown lines, one row per comparison row (``COMPARE_FIELDS`` and its own), one cell
    per column. Every experiment's comparison tables are this with its own columns."""
    return head([c.name for c in columns], [c.align for c in columns]) + \
        [row([c.cell(r) for c in columns]) for r in rows]


# ---- the result contract: what every experiment writes --------------------------------------------------
#: every row of every ``compare.json``: which setting, A and B, the outcome, A − B (``mean``) with its 95% interval
#: (``form``: ``interval``, or ``range`` under five units), the unit resampled (``scheme``: seeds, items, ...), how
#: many (``units``), and the verdict worded from the interval (``utils.stats``); a row may carry more
COMPARE_FIELDS = ("setting", "a", "b", "outcome", "mean", "lo", "hi", "form", "scheme", "units", "verdict")
#: the files every experiment writes beside ``cells/`` (and its figures)
RESULT_FILES = ("table.md", "compare.md", "compare.json", "results.json", "results.csv")


def compare_json(experiment: str, rows: list[dict], **extra) -> dict:
    """``compare.json``: the experiment's name and its comparisons, each with every field of ``COMPARE_FIELDS``
    (None where a row has no such thing) before its own, then the experiment's further tables (``extra``)."""
    return {"experiment": experiment,
            "comparisons": [{**{k: row.get(k) for k in COMPARE_FIELDS}, **row} for row in rows], **extra}
