"""Evaluation during ``fit`` and ``test``: zero-shot lm-eval tasks, logged as ``eval/<task>/<metric>``."""
from __future__ import annotations

import json
from pathlib import Path

from .callbacks import EveryNSteps, log_folder
from ..utils.atomic import savefig, write_text


class ZeroShotEval(EveryNSteps):
    """Runs lm-eval tasks on the model being trained, on rank 0, every ``every_n_steps`` optimizer
    steps, and at the end of ``cli.py test``.

    The other ranks wait at a barrier, so DDP never deadlocks; rank 0 calls the bare model, not the
    DDP wrapper, so no collective runs while they wait. Results go to the loggers and, as JSON and a
    markdown table in the paper's layout, to ``<log_dir>/eval/``.

    Args:
        tasks: task names, or the sets ``offline`` (shipped) and ``table1`` (the paper's; needs the network).
        every_n_steps: 0 disables the periodic evaluation.
        limit: documents per task during fit (keeps periodic evaluation cheap).
        on_test: also evaluate at the end of ``cli.py test``, on ``test_limit`` documents per task (None: all).
        batch_size, eval_samples, sa_mode, seed: as for ``SALM``.
    """

    def __init__(self, tasks: str | list[str] = "offline", every_n_steps: int = 0, limit: int | None = None,
                 on_test: bool = True, test_limit: int | None = None, batch_size: int = 32, eval_samples: int = 1, sa_mode: str = "stochastic",
                 seed: int = 0):
        from ..eval.harness import resolve_tasks

        super().__init__(every_n_steps)
        self.tasks = resolve_tasks(tasks)  # a bad name fails at start-up, not after hours of training
        self.limit, self.on_test, self.test_limit = limit, on_test, test_limit
        self.lm_args = {"batch_size": batch_size, "eval_samples": eval_samples, "sa_mode": sa_mode, "seed": seed}
        self.last_results: dict | None = None

    def on_fit_start(self, trainer, pl_module) -> None:
        if trainer.is_global_zero and self.every_n_steps:
            from ..eval.harness import load_tasks

            load_tasks(self.tasks)  # an unreachable dataset fails now, in one sentence

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self.due(trainer):
            self.evaluate(trainer, pl_module, f"step{trainer.global_step}", self.limit)

    def on_test_epoch_end(self, trainer, pl_module) -> None:
        if self.on_test:
            self.evaluate(trainer, pl_module, "test", self.test_limit)

    def evaluate(self, trainer, pl_module, name: str, limit: int | None) -> None:
        step = max(trainer.global_step, getattr(pl_module, "trained_steps", 0))
        name = f"{name}_step{step}" if name == "test" else name
        folder = Path(log_folder(trainer, "eval"))
        if trainer.is_global_zero:
            from ..eval.harness import layout_for, run_tasks, scalars
            from ..eval.lm import SALM
            from ..eval.table import markdown_table

            net = pl_module.net
            was_training = net.training
            tokenizer = getattr(trainer.datamodule, "tokenizer", None)
            try:
                lm = SALM(net, tokenizer=tokenizer, **self.lm_args)
                results = run_tasks(lm, self.tasks, limit=limit)
            finally:
                net.train(was_training)
            self.last_results = results
            for logger in trainer.loggers:
                logger.log_metrics(scalars(results), step=step)
            from ..eval.evaluate import label_of

            scored = f"the first {limit} documents of each task" if limit else "every document of each task"
            table = f"Zero-shot at step {step}, {scored}.\n\n" + markdown_table(
                {label_of({"arch": pl_module.arch.to_dict()}): results}, layout_for(results))
            folder.mkdir(parents=True, exist_ok=True)
            write_text(folder / f"{name}.json", json.dumps(results, indent=2))
            write_text(folder / f"{name}.md", table)
            print(f"\nzero-shot at step {step}, {scored} ({folder / name}.md):\n{table}", flush=True)
        trainer.strategy.barrier("zero_shot_eval")


class AttentionMapLogger(EveryNSteps):
    """Draws the Figure 3 heat maps (full, SWA, SA, SA+SWA on the model's own queries and keys) every
    ``every_n_steps`` steps and at the end of fit, as a TensorBoard image and a PNG in
    ``<log_dir>/attention_maps/``. Rank 0 only; the maps need no other rank.

    Args: as ``cli.py analyze attention-maps`` (layer is clipped to the model's depth).
    """

    def __init__(self, every_n_steps: int = 0, at_fit_end: bool = True, layer: int = 11, head: int = 0,
                 window: int = 8, tokens: int = 27, text: str | None = None,
                 variants: tuple[str, ...] | None = None, seed: int = 0):
        from ..analysis.attention_maps import FIGURE_3
        from ..attention import get_variant

        variants = FIGURE_3 if variants is None else variants
        for name in variants:
            get_variant(name)
        super().__init__(every_n_steps)
        self.at_fit_end = at_fit_end
        self.kwargs = {"layer": layer, "head": head, "window": window, "tokens": tokens, "text": text,
                       "variants": tuple(variants), "seed": seed}
        self.written: list[Path] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self.due(trainer):
            self.draw(trainer, pl_module)

    def on_fit_end(self, trainer, pl_module) -> None:
        if self.at_fit_end:
            self.draw(trainer, pl_module)

    def draw(self, trainer, pl_module) -> None:
        folder = Path(log_folder(trainer, "attention_maps"))
        if not trainer.is_global_zero:
            return
        from ..analysis.attention_maps import attention_maps
        from ..utils.report import pyplot

        plt = pyplot()

        net = pl_module.net
        was_training = net.training
        try:
            fig, _, _ = attention_maps(net, trainer.datamodule.tokenizer, **self.kwargs)
        finally:
            net.train(was_training)
        try:  # the figure is closed also when a write fails
            folder.mkdir(parents=True, exist_ok=True)
            path = folder / f"step{trainer.global_step}.png"
            savefig(fig, path, dpi=140)
            self.written.append(path)
            for logger in trainer.loggers:
                experiment = getattr(logger, "experiment", None)
                if hasattr(experiment, "add_figure"):
                    experiment.add_figure("attention_maps", fig, global_step=trainer.global_step)
        finally:
            plt.close(fig)
