"""``cli.py sweep``: the paper's training-free window sweeps (§4.2, Tables 4-5, Figures 4-8).

    python cli.py sweep --config configs/sweep/qwen3_8b.yaml [--limit 200] [--out outputs/sweep/qwen3_8b]

One model is loaded once; every cell (mode, window, sink, seed, task) patches its prefill and runs one
task: an lm-eval task, or ``position_ppl_<n>`` (perplexity by token position, ``eval.position``). Each finished cell is written at once to ``<out>/cells/``, and a rerun skips the cells
already there, so a killed sweep resumes where it stopped. At the end, moved into place together (a
failure while they are written leaves the previous ones whole): ``config.json``, ``results.json``,
``results.csv``, ``table.md`` (rows w_eff x mode, columns the tasks and their average; best in bold
and second underlined within each w_eff) and the plots ``average.png`` (Figure 4) and ``tasks.png``
(Figures 5-8). Every cell also records its budget, the mean keys each query attended (counted by the
patcher from the masks its kernels used), so ``budget.png`` sets score against keys per query, and
``position.png`` draws the perplexity by position of the ``position_ppl_*`` tasks.

Every cell also keeps its per-item records beside it (``cells/<cell>.items.jsonl.gz``: each document's scores and
log-likelihoods from lm-eval's logged samples, or each ``position_ppl_*`` document's per-token NLL), so that every
number in ``table.md`` carries a 95% interval and ``compare.md``/``compare.json`` hold the config's paired
comparisons and the ΔNLL against full attention (``compare.py``). A cell on disk without them is run again.
``--compare`` runs no cell: it writes the tables and comparisons from the cells already there.

This module runs the cells; ``plan.py`` holds the config, the cells and the refusals made before a model
loads, and ``sweep_report.py`` makes the tables and plots.
"""
from __future__ import annotations

import time
from dataclasses import asdict
from pathlib import Path

from ..eval.position import context_length, is_position_task
from ..utils.atomic import check_results_folder
from ..utils.runner import cells_lock, folder_lock, run_cells, unique_seeds
from .plan import (Cell, SweepConfig, cell_path, cells, check_before_loading, is_done, load_config, load_error,
                   made_by, metric_of)
from .sweep_report import report


def load_model(cfg: SweepConfig, source=None):
    """The Hugging Face model and tokenizer through ``models.sources`` (Hub id, folder or GGUF file); clear
    sentences for a missing model and for remote code."""
    from ..models.sources import load_causal_lm, resolve, tokenizer_for

    source = source or resolve(cfg.model)
    try:
        model = load_causal_lm(source, cfg.dtype, cfg.device_map, cfg.trust_remote_code)
        tokenizer = tokenizer_for(source, cfg.tokenizer, cfg.trust_remote_code)
    except (OSError, ValueError) as err:
        raise load_error(cfg, err) from None
    return model, tokenizer


def run_cell(lm, cell: Cell, cfg: SweepConfig, metadata: dict) -> tuple[dict, float | None, list[dict]]:
    """Run one cell on the patched model; returns its metrics, the keys each query attended and its per-item
    records (lm-eval's logged samples, or each document's per-token NLL for ``position_ppl_*``)."""
    from ..eval.harness import run_tasks_with_items
    from ..eval.position import position_records
    from ..models.patcher import counting_keys

    limit = (cfg.task_limits or {}).get(cell.task, cfg.limit)
    with counting_keys() as counted:
        if is_position_task(cell.task):
            metrics, items = position_records(lm.model, lm.tokenizer, context_length(cell.task), limit=limit)
        else:
            results, items_by_task = run_tasks_with_items(
                lm, [cell.task], limit=limit, seed=1234, num_fewshot=cfg.num_fewshot,
                confirm_run_unsafe_code=cfg.confirm_run_unsafe_code, metadata=metadata)
            metrics, items = results.get(cell.task, {}), items_by_task.get(cell.task, [])
    budget = counted["keys"] / counted["queries"] if counted["queries"] else None
    return metrics, budget, items


def weights_of(source) -> str | None:
    """The fingerprint of a local model's bytes (``utils.runner.fingerprint``: a folder, or a GGUF file), so that a
    cell is reused only for the same weights, not the same path; None for a Hub id (its name is its version)."""
    from ..utils.runner import fingerprint

    path = Path(source.path) / source.gguf_file if source.gguf_file else Path(source.path)
    return fingerprint(path) if path.exists() else None


def run(cfg: SweepConfig) -> dict:
    from ..eval.harness import resolve_tasks
    from ..models.sources import resolve

    source = resolve(cfg.model)  # a missing or unpatchable GGUF fails here, in one sentence
    # lm-eval names (task sets such as table1 expand); position_ppl_* is ours and stays as it is
    cfg.tasks = [name for t in cfg.tasks for name in ([t] if is_position_task(t) else resolve_tasks([t]))]
    cfg.seeds = unique_seeds(cfg.seeds, "sweep seeds")
    todo = cells(cfg)
    out = check_results_folder(cfg.out, "sweep", "out")
    if cfg.cells_only:  # an array's task: beside the array's other tasks, on cells of its own
        if cfg.compare:
            raise ValueError("--cells_only runs cells without the tables and --compare writes the tables without "
                             "running cells: pass one of them.")
        with cells_lock(out, [c.key for c in todo], "sweep"):
            return _run(cfg, source, out, todo)
    with folder_lock(out, "sweep"):  # one sweep at a time in one folder; dropped when it ends, however it ends
        return _run(cfg, source, out, todo)


def _run(cfg: SweepConfig, source, out: Path, todo: list[Cell]) -> dict:
    from ..eval.harness import load_tasks
    from ..models.patcher import patch
    from ..models.sources import loadable
    from .lm import PatchedHFLM

    weights = weights_of(source)
    made = {c.key: made_by(cfg, c, weights) for c in todo}
    pending = [c for c in todo if not is_done(cell_path(out, c), c, made[c.key])]  # before anything is written
    (out / "cells").mkdir(parents=True, exist_ok=True)
    if cfg.compare:
        if not any(cell_path(out, c).exists() for c in todo):
            raise ValueError(f"--compare reports the cells of a sweep, and {out / 'cells'} holds none of this "
                             "config's; run the sweep first (without --compare), or pass its --out.")
        print(f"sweep --compare: {len(todo) - len(pending)} of {len(todo)} cells done; reporting them, running none",
              flush=True)
        return report(cfg, out)
    again = sum(cell_path(out, c).exists() for c in pending)
    print(f"sweep: {len(todo)} cells, {len(todo) - len(pending)} already done, {len(pending)} to run" +
          (f" ({again} of them again: written with another spec, without per-item records, or damaged)"
           if again else ""), flush=True)
    if pending:
        check_before_loading(cfg, source, cfg.tasks)
        # the pass-key tasks size their prompts in the tokens of this tokenizer (lm-eval hands it to their loader)
        # (a cached GGUF's converted folder: its tokenizer loads without parsing the GGUF again)
        tokens = loadable(source)
        metadata = {"tokenizer": cfg.tokenizer or tokens.path, **({} if cfg.tokenizer else tokens.kwargs)}
        lm_tasks = sorted({c.task for c in pending if not is_position_task(c.task)})
        if lm_tasks:
            load_tasks(lm_tasks, metadata=metadata)  # unreachable datasets fail before the model loads
        model, tokenizer = load_model(cfg, source)
        lm = PatchedHFLM(model, tokenizer=tokenizer, batch_size=cfg.batch_size, max_length=cfg.max_length,
                         device=str(model.device))

        def run_one(cell: Cell, spec: dict) -> dict:
            start = time.perf_counter()
            patch(model, cell.spec)
            metrics, budget, items = run_cell(lm, cell, cfg, metadata)
            return {"mode": cell.mode, "w_eff": cell.w_eff, "sink": cell.sink, "seed": cell.seed, "task": cell.task,
                    "made_by": made[cell.key], "metrics": metrics, "keys_per_query": budget,
                    "seconds": time.perf_counter() - start, "items": items}

        # ``pending`` holds the cells ``is_done`` found missing, damaged or made otherwise (weights included): all run
        run_cells(pending, out, lambda c: c.key, lambda c: asdict(c.spec), run_one, line=_line, needs="items",
                  kind="sweep", reuse=lambda saved, spec: False)
    if cfg.cells_only:
        print(f"sweep --cells_only: {len(todo)} cells in {out / 'cells'}; the tables come from the report job "
              "(or `sweep --compare` with the whole config)", flush=True)
        return {"cells": [c.key for c in todo]}
    return report(cfg, out)


def _line(record: dict) -> str:
    """A finished cell's line after its key (mode, window, sink, seed, task): its metric and keys per query."""
    name, value = metric_of(record["task"], record["metrics"])
    shown = f"{name}={value:.4f}" if value is not None else "no metric"
    return shown + (f", {record['keys_per_query']:.1f} keys/query" if record.get("keys_per_query") is not None else "")


def main(argv: list[str] | None = None) -> dict:
    return run(load_config(argv, description=__doc__.splitlines()[0]))
