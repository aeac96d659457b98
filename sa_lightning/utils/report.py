"""What every table and figure of the package shares: variant colours and labels, task labels, the
matplotlib set-up and the markdown tables in the paper's style (best in bold, second best underlined).

Figures are still saved through ``utils.atomic.savefig`` and CSVs written through ``utils.tables.write_csv``.
"""
from __future__ import annotations

#: one colour per attention variant, in every plot (bench-only names included); the order is the legend order
COLORS = {"swa": "#4A90D9", "sa": "#E74C3C", "sa_swa": "#2ECC71", "full": "#7F7F7F", "moba": "#F39C12",
          "sa_swa_union": "#2ECC71", "full_window": "#333333", "sa_flex": "#9B59B6"}

#: each variant's plot marker, so that lines that coincide (several at 0%, or at full attention's score) still
#: show every variant's markers; the training-free union shares SA+SWA's
MARKERS = {"swa": "o", "sa": "^", "sa_swa": "D", "sa_swa_union": "D", "moba": "v"}

#: display names; the training-free union reads SA+SWA like the gated pair (the context tells them apart)
VARIANT_LABELS = {"full": "Full", "swa": "SWA", "sa": "SA", "sa_swa": "SA+SWA", "sa_swa_union": "SA+SWA",
                  "moba": "MoBA", "full_window": "Full (w=n)", "sa_flex": "SA (flex fwd)"}
WINDOWED = ("swa", "sa", "sa_swa", "sa_swa_union")

#: the short column names of the sweep tables (Tables 4-5)
TASK_LABELS = {"hellaswag": "Hella.", "mmlu": "MMLU", "arc_challenge": "ARC-C", "boolq": "BoolQ",
               "lambada_openai": "LMB", "arc_easy": "ARC-E", "humaneval": "HuEval", "humaneval_exec": "HuEval",
               "shakespeare_lastword": "LW", "shakespeare_choice": "MC", "passkey_512": "PK-512",
               "passkey_1k": "PK-1k", "passkey_2k": "PK-2k", "passkey_4k": "PK-4k"}

MISSING = "–"


# ---- labels ---------------------------------------------------------------------------------------
def variant_label(variant: str, window: int | None = None, block_size: int | None = None, top_k: int | None = None,
                  sink: int = 0) -> str:
    """``SA``, ``SWA+sink4``, ``SA+SWA (w=32)``, ``MoBA (c=64, k=2)``, ``Full``: a variant's name in a table or
    legend, with its window (windowed variants) or block and top-k (MoBA) when given."""
    label = VARIANT_LABELS.get(variant, variant.replace("_", "+").upper())
    if sink:
        label += f"+sink{sink}"
    if variant in WINDOWED and window is not None:
        label += f" (w={window})"
    elif variant == "moba" and block_size is not None and top_k is not None:
        label += f" (c={block_size}, k={top_k})"
    return label


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


# ---- markdown tables ------------------------------------------------------------------------------
def number(value: float | None, spec: str) -> str:
    """``format(value, spec)`` for a table cell, or "–" for a value that is missing (None) or not a number."""
    return MISSING if value is None or value != value else format(value, spec)


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


def row(cells) -> str:
    """One markdown table row."""
    return "| " + " | ".join(str(c) for c in cells) + " |"


def head(names, align: str | list[str] = "---") -> list[str]:
    """A markdown header and its rule; ``align`` is one rule for every column (``---``, ``---:``) or one each."""
    names = list(names)
    rules = [align] * len(names) if isinstance(align, str) else align
    return [row(names), "|" + "".join(f"{r}|" for r in rules)]
