"""``cli.py sweep``: the paper's training-free window sweeps (§4.2, Tables 4-5, Figures 4-8).

    python cli.py sweep --config configs/sweep/qwen3_8b.yaml [--limit 200] [--out outputs/sweep/qwen3_8b]

One model is loaded once; every cell (mode, window, sink, seed, task) patches its prefill and runs one task: an
lm-eval task, or ``position_ppl_<n>`` (perplexity by token position, ``eval.position``). Each finished cell is
written at once to ``<out>/cells/`` with its per-item records (each document's scores and log-likelihoods, or each
``position_ppl_*`` document's per-token NLL), and a rerun reuses every cell whose spec is equal (its patch, and the
model by its weights' bytes, the tokenizer, the limit, ...), so a killed sweep resumes where it stopped. At the end,
written together: ``table.md`` (rows w_eff x mode, columns the tasks and their average, each with its 95%
interval; best in bold and second underlined within each w_eff), ``compare.md``/``compare.json`` (the configured
paired comparisons and the ΔNLL against full attention), ``results.json``, ``results.csv``, ``config.json`` and the
plots ``average.png`` (Figure 4), ``tasks.png`` (Figures 5-8), ``budget.png`` (score against the keys each query
attended, counted by the patcher) and ``position.png``. ``--compare`` runs no cell: it writes the report from the
cells already there; ``--cells_only`` runs cells and no report (a SLURM array's task, beside the array's others).

``inference.plan`` holds the config, the cells and the refusals made before a model loads, this file the model and
one cell's run, ``inference.sweep_report`` the tables and plots.
"""
from __future__ import annotations

import json
import time
from dataclasses import asdict
from functools import cached_property
from pathlib import Path

from ..eval.position import context_length, is_position_task
from ..inference.plan import Cell, SweepConfig, cell_spec, cells, check_before_loading, load_error, made_by, metric_of
from .base import Experiment, Report, config_flags
from .base import main as run_experiment


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


class Sweep(Experiment):
    name = "sweep"
    kind = "sweep"
    config = SweepConfig
    presets_note = "configs/sweep/*.yaml name theirs: quick, for one"
    folders = "the config's out"
    flags = config_flags(SweepConfig)
    needs = "items"
    #: a record of the same patch made by another model, tokenizer, limit, ... refuses the folder before any cell runs
    provenance = "made_by"

    @cached_property
    def source(self):
        """The model's source (``models.sources``): a missing or unpatchable GGUF fails here, in one sentence."""
        from ..models.sources import resolve

        return resolve(self.cfg.model)

    @cached_property
    def weights(self) -> str | None:
        """The fingerprint of a local model's bytes (``utils.runner.fingerprint``: a folder, or a GGUF file), so that
        a cell is reused only for the same weights, not the same path; None for a Hub id (its name is its version).
        Taken the first time a cell's spec asks (seconds to minutes for a large model), so once this run holds its
        folder (a folder in use is refused before)."""
        from ..utils.runner import fingerprint

        source = self.source
        path = Path(source.path) / source.gguf_file if source.gguf_file else Path(source.path)
        return fingerprint(path) if path.exists() else None

    @cached_property
    def patched(self):
        """The patched model and the tasks' metadata, loaded when the first cell runs: every refusal before the first
        cell file is written, then every dataset, then the model, once."""
        from ..eval.harness import load_tasks
        from ..inference.lm import PatchedHFLM
        from ..models.sources import loadable

        cfg = self.cfg
        check_before_loading(cfg, self.source, cfg.tasks)
        # the pass-key tasks size their prompts in the tokens of this tokenizer (lm-eval hands it to their loader)
        tokens = loadable(self.source)  # a cached GGUF's converted folder: no second parse
        metadata = {"tokenizer": cfg.tokenizer or tokens.path, **({} if cfg.tokenizer else tokens.kwargs)}
        lm_tasks = sorted({t for t in cfg.tasks if not is_position_task(t)})
        if lm_tasks:
            load_tasks(lm_tasks, metadata=metadata)  # unreachable datasets fail before the model loads
        model, tokenizer = load_model(cfg, self.source)
        return PatchedHFLM(model, tokenizer=tokenizer, batch_size=cfg.batch_size, max_length=cfg.max_length,
                           device=str(model.device)), metadata

    def cells(self, cfg):
        return cells(cfg)

    def spec(self, cell: Cell, cfg, out):
        return cell_spec(cell, made_by(cfg, cell, self.weights))

    def loaded(self, saved):
        """A record with its items as the numbers the report takes (``compare.item_values``), not the documents."""
        from ..inference.compare import item_values

        items = saved.pop("items", None)
        return {**saved, "values": item_values(saved["task"], saved.get("metrics", {}), items)
                if isinstance(items, list) else None}

    def run(self, cell: Cell, spec: dict) -> dict:
        """Patch the model for the cell and run its task: its metrics, the keys each query attended (counted by the
        patcher) and its per-item records (lm-eval's logged samples, or each document's per-token NLL for
        ``position_ppl_*``)."""
        from ..eval.harness import run_tasks_with_items
        from ..eval.position import position_records
        from ..models.patcher import counting_keys, patch

        (lm, metadata), cfg = self.patched, self.cfg
        start = time.perf_counter()
        patch(lm.model, cell.spec)
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
        return {"mode": cell.mode, "w_eff": cell.w_eff, "sink": cell.sink, "seed": cell.seed, "task": cell.task,
                "metrics": metrics, "keys_per_query": budget, "seconds": time.perf_counter() - start, "items": items}

    def line(self, record):
        """A finished cell's line after its key (mode, window, sink, seed, task): its metric and keys per query."""
        name, value = metric_of(record["task"], record["metrics"])
        shown = f"{name}={value:.4f}" if value is not None else "no metric"
        kpq = record.get("keys_per_query")
        return shown + (f", {kpq:.1f} keys/query" if kpq is not None else "")

    def report(self, cfg, records, out):
        from ..inference.sweep_report import report

        made = report(cfg, records, out)
        compared = made["compared"]
        return Report(table=made["table"], compare=compared.text, comparisons=compared.rows, rows=made["rows"],
                      figures=made["figures"], views={"config.json": json.dumps(asdict(cfg), indent=2)},
                      compare_extra=compared.extra, summary=compared.summary, csv_fields=made["csv_fields"])


EXPERIMENT = Sweep()


def main(argv: list[str] | None = None) -> dict:
    return run_experiment(EXPERIMENT, argv)
