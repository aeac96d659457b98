"""One cell of a training-free sweep (``experiments.sweep``): the Hugging Face model it loads once, one cell's run
on the patched model (its metrics, the keys each query attended and its per-item records), the fingerprint of a
local model's weights, and a finished cell's line.
"""
from __future__ import annotations

from pathlib import Path

from ..eval.position import context_length, is_position_task
from .plan import Cell, SweepConfig, load_error, metric_of


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


def line(record: dict) -> str:
    """A finished cell's line after its key (mode, window, sink, seed, task): its metric and keys per query."""
    name, value = metric_of(record["task"], record["metrics"])
    shown = f"{name}={value:.4f}" if value is not None else "no metric"
    return shown + (f", {record['keys_per_query']:.1f} keys/query" if record.get("keys_per_query") is not None else "")

