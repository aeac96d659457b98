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

``inference.plan`` holds the config, the cells and the refusals made before a model loads, ``inference.sweep`` the
model and one cell's run, ``inference.sweep_report`` the tables and plots.
"""
from __future__ import annotations

import json
import time
from dataclasses import asdict
from functools import cached_property

from ..inference.plan import Cell, SweepConfig, cell_spec, cells, check_before_loading, made_by
from ..inference.sweep import line, load_model, run_cell, weights_of
from .base import Experiment, Report, config_flags
from .base import main as run_experiment


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
        """The model's fingerprint (its bytes hashed: seconds to minutes for a large model), taken the first time a
        cell's spec asks, so once this run holds its folder (a folder in use is refused before)."""
        return weights_of(self.source)

    @cached_property
    def patched(self):
        """The patched model and the tasks' metadata, loaded when the first cell runs: every refusal before the first
        cell file is written, then every dataset, then the model, once."""
        from ..eval.harness import load_tasks
        from ..eval.position import is_position_task
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
        from ..models.patcher import patch

        lm, metadata = self.patched
        start = time.perf_counter()
        patch(lm.model, cell.spec)
        metrics, budget, items = run_cell(lm, cell, self.cfg, metadata)
        return {"mode": cell.mode, "w_eff": cell.w_eff, "sink": cell.sink, "seed": cell.seed, "task": cell.task,
                "metrics": metrics, "keys_per_query": budget,
                "seconds": time.perf_counter() - start, "items": items}

    def line(self, record):
        return line(record)

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
