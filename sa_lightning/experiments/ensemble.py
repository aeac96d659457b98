"""``--ensemble K``: a study's cells that differ only in their training seed train K at a time as one ensemble
(``lit.seeds``), each member exactly as its seed trains alone (to the tolerance ``lit.seeds`` states), and each
still written as its own cell: the same ``cells/<id>.json`` record under the same spec, so reports, statistics and
reuse do not change. A later run without ``--ensemble`` reuses these records, and the reverse.

It plugs into the runner as the cell function: the first of a group's cells that the runner hands out trains the
whole group (the cells of one setting still to be trained, K at a time in seed order) and scores every member; the
runner then gets each other member's record at once when it reaches that cell. So the groups train in this process,
one after another (``jobs`` 1, said in one line where ``--jobs`` asks for more: the runner's workers take single
cells, and a group's members are records of the one process that trained them), each with every thread of the
machine. Each member leaves the ``last.ckpt`` its seed's own fit leaves (``lit.seeds.save_member``), so a member
trained before with the same fit arguments is scored again from it, not trained (``training.trained_checkpoint``).
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Callable

from ..utils import runner
from .training import trained_checkpoint


def setting(cell: dict) -> tuple:
    """What the members of an ensemble share: every field of the cell but its seed."""
    return tuple(sorted((k, v) for k, v in cell.items() if k != "seed"))


class EnsembleRun:
    """The runner's ``run(cell, spec)`` for a study whose cells train K seeds at a time.

    Args:
        cells: the study's cells, in the runner's order. out: its folder. cell_id, spec_of: the study's.
        size: K, the most members in one ensemble. score: ``score(cell, spec, cli, train_seconds, steps)``, the
            study's record of a trained cell (``long_range.score_cell``). alone: ``run(cell, spec)`` for a cell
            that needs no training (scored again from its checkpoint) or has no companion left.
        say: where the progress lines go. reuse: the study's reuse rule (``Experiment.reuse``), as the runner's.
    """

    def __init__(self, cells: list[dict], out: Path, cell_id: Callable, spec_of: Callable, size: int,
                 score: Callable, alone: Callable, say: Callable[[str], None] = print,
                 reuse: Callable[[dict, dict], bool] = runner.same_spec):
        if size < 1:
            raise ValueError(f"--ensemble must be >= 1, got {size}.")
        self.cells, self.out, self.cell_id, self.spec_of = cells, out, cell_id, spec_of
        self.size, self.score, self.alone, self.say, self.reuse = size, score, alone, say, reuse
        self.ready: dict[str, dict] = {}  # records of members trained in an earlier cell's ensemble
        self.handled: set[str] = set()  # every cell this run has trained or handed on, in a group or alone

    def __call__(self, cell: dict, spec: dict) -> dict:
        key = self.cell_id(cell)
        if key in self.ready:
            return self.ready.pop(key)
        self.handled.add(key)
        if spec.get("trained"):
            return self.alone(cell, spec)
        group = self.group(cell)
        if len(group) == 1:
            return self.alone(cell, spec)
        self.handled.update(self.cell_id(c) for c in group)
        records = self.train(group, {self.cell_id(c): (spec if self.cell_id(c) == key else self.spec_of(c))
                                     for c in group})
        self.ready.update({k: r for k, r in records.items() if k != key})
        return records[key]

    def group(self, cell: dict) -> list[dict]:
        """``cell`` and the next cells of its setting still to train (no record of this spec, none to rescore, not
        trained already in this run), at most K in all, in seed order."""
        same = [c for c in self.cells if setting(c) == setting(cell) and c["seed"] != cell["seed"]
                and self.cell_id(c) not in self.handled and self.to_train(c)]
        return [cell] + sorted(same, key=lambda c: c["seed"])[:self.size - 1]

    def to_train(self, cell: dict) -> bool:
        """Whether the runner will train this cell: no record that stands for it (the study's reuse rule, as the
        runner applies it), and none made with its fit arguments whose checkpoint could be scored again."""
        spec = self.spec_of(cell)
        saved = runner.read_cell(self.out / "cells" / f"{self.cell_id(cell)}.json", "scores")
        return not runner.stands_for(saved, spec, self.reuse) and trained_checkpoint(saved, spec) is None

    def train(self, group: list[dict], specs: dict[str, dict]) -> dict[str, dict]:
        """Every member of ``group`` trained as one ensemble, then scored: {cell id: record}. An ensemble that runs
        out of GPU memory trains as its two halves instead (each member's start is its seed's own, so a member of a
        half trains as it would have in the whole), and later groups start at that size."""
        import torch

        try:
            return self.train_together(group, specs)
        except torch.cuda.OutOfMemoryError:
            if len(group) == 1:
                raise
        # here, past the except clause, its traceback no longer holds the failed ensemble's tensors
        half = len(group) // 2
        torch.cuda.empty_cache()
        self.say(f"ensemble of {len(group)}: out of GPU memory; training it as {half} and {len(group) - half} "
                 f"instead, and at most {half} at a time from here (--ensemble {half})")
        self.size = min(self.size, half)
        return {**self.train(group[:half], specs), **self.train(group[half:], specs)}

    def train_together(self, group: list[dict], specs: dict[str, dict]) -> dict[str, dict]:
        """Every member of ``group`` trained as one ensemble, then scored: {cell id: record}."""
        from ..lit import seeds
        from ..lit.cli import run as run_cli

        ids = [self.cell_id(c) for c in group]
        self.say(f"ensemble of {len(group)}: {', '.join(ids)}: training together")
        clis = []
        for cell in group:
            args = [str(a) for a in specs[self.cell_id(cell)]["fit_args"]]
            if args[:1] != ["fit"]:
                raise ValueError(f"{self.cell_id(cell)}: an ensemble member is a `cli.py fit` line, got {args[:1]}.")
            folder = Path(args[args.index("--trainer.default_root_dir") + 1])
            folder.mkdir(parents=True, exist_ok=True)
            clis.append(run_cli(args[1:], run=False))
        seconds = seeds.fit_clis(clis, say=lambda line: self.say(f"ensemble {ids[0]}..: {line}"))
        records = {}
        for cell, cli in zip(group, clis):
            start = time.perf_counter()
            record = self.score(cell, specs[self.cell_id(cell)], cli, seconds / len(group),
                                int(cli.trainer.max_steps))
            records[self.cell_id(cell)] = {**record, "seconds": round(seconds / len(group)
                                                                       + time.perf_counter() - start, 1)}
        return records

