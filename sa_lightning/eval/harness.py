"""Running lm-eval tasks on our models, and laying the results out as the paper's Table 1.

``run_tasks`` loads the tasks first (so a bad name or an unreachable dataset fails in one sentence
before any scoring), then runs ``lm_eval.simple_evaluate`` and returns ``{task: {metric: value}}``.
"""
from __future__ import annotations

import difflib
import functools
import logging
import os
from dataclasses import dataclass

from .offline import TASK_NAMES as OFFLINE_TASKS
from .offline import TASKS_DIR


@dataclass(frozen=True)
class Column:
    label: str
    task: str
    metric: str
    lower_is_better: bool = False

    @property
    def is_accuracy(self) -> bool:
        return self.metric.startswith("acc")


#: The paper's Table 1: perplexities, then accuracies (in %), then their average.
TABLE1 = (
    Column("Wiki. ppl", "wikitext", "word_perplexity", True),
    Column("LMB-o ppl", "lambada_openai", "perplexity", True),
    Column("LMB-s ppl", "lambada_standard", "perplexity", True),
    Column("LMB-o", "lambada_openai", "acc"),
    Column("LMB-s", "lambada_standard", "acc"),
    Column("PIQA", "piqa", "acc"),
    Column("Hella.", "hellaswag", "acc_norm"),
    Column("Wino.", "winogrande", "acc"),
    Column("ARC-e", "arc_easy", "acc"),
)
#: The same layout over the shipped offline tasks (rolling ppl, last word, multiple choice).
OFFLINE = (
    Column("Shk. ppl", "shakespeare_rolling", "word_perplexity", True),
    Column("LW ppl", "shakespeare_lastword", "perplexity", True),
    Column("LW", "shakespeare_lastword", "acc"),
    Column("MC", "shakespeare_choice", "acc_norm"),
)
LAYOUTS = {"table1": TABLE1, "offline": OFFLINE}
TASK_SETS = {name: tuple(dict.fromkeys(c.task for c in cols)) for name, cols in LAYOUTS.items()}


def layout_for(results: dict[str, dict[str, float]]) -> tuple[Column, ...]:
    """The paper's (or the offline) columns for the tasks in ``results``, then one column for each other task."""
    cols = [c for layout in LAYOUTS.values() for c in layout if c.task in results]
    covered = {c.task for c in cols}
    for task, metrics in results.items():
        if task in covered or not metrics:
            continue
        metric = next((m for m in ("acc_norm", "acc", "exact_match", "word_perplexity", "perplexity") if m in metrics),
                      next((m for m in metrics if not m.endswith("_stderr") and m != "sample_len"), None))
        if metric is None:
            continue
        cols.append(Column(task, task, metric, "perplexity" in metric))
    return tuple(cols)


def is_offline() -> bool:
    return os.environ.get("HF_DATASETS_OFFLINE") == "1" or os.environ.get("HF_HUB_OFFLINE") == "1"


class _QuietCustomDataset(logging.Filter):
    """lm-eval warns, once per task, that a ``custom_dataset`` task takes ``--metadata``; ours take none."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "Custom kwargs can be passed" not in record.getMessage()


@functools.lru_cache(maxsize=2)
def task_manager(defaults: bool = True):
    """lm-eval's task index with the shipped tasks added; ``defaults=False`` indexes the shipped tasks only,
    which takes milliseconds where lm-eval's own thousands of task files take seconds at every start."""
    from lm_eval.tasks import TaskManager

    logging.getLogger("lm_eval.api.task").addFilter(_QuietCustomDataset())
    return TaskManager(include_path=str(TASKS_DIR), include_defaults=defaults)


def _manager_for(names) -> "object":
    """The cheapest task index that knows every name: the shipped tasks' own when that is all they are."""
    return task_manager(defaults=not set(names) <= set(OFFLINE_TASKS))


def resolve_tasks(names: str | list[str]) -> list[str]:
    """Expand ``table1`` / ``offline`` and comma lists; an unknown name raises with its close matches."""
    if isinstance(names, str):
        names = [names]
    out: list[str] = []
    for name in (part.strip() for item in names for part in str(item).split(",") if part.strip()):
        if name in TASK_SETS:
            out.extend(TASK_SETS[name])
            continue
        if name in OFFLINE_TASKS:
            out.append(name)
            continue
        known = task_manager().all_tasks
        if name not in known:
            close = difflib.get_close_matches(name, [*TASK_SETS, *known], n=4, cutoff=0.6)
            hint = f" Close matches: {', '.join(close)}." if close else ""
            raise ValueError(f"unknown task {name!r}: lm-eval has no such task, group or tag.{hint} "
                             f"Task sets: {', '.join(TASK_SETS)}.")
        out.append(name)
    return list(dict.fromkeys(out))


def _load(name: str) -> list:
    """The lm-eval Task objects of one name (this fetches their datasets); offline misses end in one sentence."""
    try:
        return list(_manager_for([name]).load([name])["tasks"].values())
    except Exception as err:  # datasets raises many types for "not reachable / not cached"
        if name in OFFLINE_TASKS:
            raise
        where = "the network is off (HF_DATASETS_OFFLINE=1) and it is not in the local datasets cache" \
            if is_offline() else f"it could not be downloaded ({type(err).__name__}: {str(err).splitlines()[0][:160]})"
        raise ValueError(
            f"task {name!r} needs its dataset from the Hugging Face Hub, which cannot be had offline: {where}. "
            f"Use the shipped offline tasks instead: --tasks offline ({', '.join(OFFLINE_TASKS)})."
        ) from None


def load_tasks(names: list[str]) -> list:
    """Build the lm-eval Task objects of ``names``; an unreachable dataset fails here, in one sentence."""
    return [task for name in names for task in _load(name)]


def run_tasks(lm, tasks: list[str], *, limit: int | float | None = None, bootstrap_iters: int = 0,
              seed: int = 1234, num_fewshot: int | None = None,
              confirm_run_unsafe_code: bool = False) -> dict[str, dict[str, float]]:
    """Evaluate ``lm`` (an lm-eval ``LM``) on ``tasks``; returns ``{task: {metric: value}}``."""
    import lm_eval

    names = resolve_tasks(tasks)
    manager = _manager_for(names)
    groups = set(manager.all_groups)
    specs = []
    for name in names:
        loaded = _load(name)
        # a group (mmlu) goes by name so that lm-eval aggregates its subtasks; its datasets are cached by now
        specs.extend([name] if name in groups else loaded)
    raw = lm_eval.simple_evaluate(model=lm, tasks=specs, task_manager=manager, limit=limit,
                                  num_fewshot=num_fewshot, bootstrap_iters=bootstrap_iters, log_samples=False,
                                  random_seed=seed, numpy_random_seed=seed, torch_random_seed=seed,
                                  fewshot_random_seed=seed, confirm_run_unsafe_code=confirm_run_unsafe_code)
    return flatten(raw["results"])


def scalars(results: dict[str, dict[str, float]]) -> dict[str, float]:
    """``{"eval/<task>/<metric>": value}`` for the loggers: the metrics themselves, not stderrs or counts."""
    return {f"eval/{task}/{metric}": value for task, metrics in results.items() for metric, value in metrics.items()
            if metric != "sample_len" and not metric.endswith("_stderr")}


def flatten(results: dict) -> dict[str, dict[str, float]]:
    """lm-eval's ``{"acc,none": x, "acc_stderr,none": s}`` -> ``{"acc": x, "acc_stderr": s}``, numbers only."""
    out = {}
    for task, metrics in results.items():
        clean = {}
        for key, value in metrics.items():
            name, _, flt = key.partition(",")
            if isinstance(value, (int, float)) and not isinstance(value, bool) and flt in ("", "none"):
                clean[name] = float(value)
        out[task] = clean
    return out
