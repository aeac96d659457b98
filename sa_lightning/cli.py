"""LightningCLI for sa_lightning: ``python cli.py fit|validate|test|predict --config <yaml>``.

Configs are parsed with OmegaConf (interpolation allowed). The data's vocabulary size is linked into
the model, and ``model.max_tokens`` (the paper gives its budget in tokens) becomes ``trainer.max_steps``.

``data`` is an ``LMDataModule`` unless the config names another class (``data.class_path``, e.g. the
synthetic recall tasks' ``sa_lightning.data.SyntheticDataModule``); a ``data`` section without
``class_path`` is ``LMDataModule``'s arguments, as in every text config.
"""
from __future__ import annotations

import lightning as L
from lightning.pytorch.cli import LightningCLI

from .lit import LitLM
from .lit.schedule import steps_for_tokens, tokens_per_step


def _int_seed(seed) -> int:
    if isinstance(seed, bool) or seed is None:
        raise ValueError("seed_everything must be an integer so that permutations and data order can be reproduced.")
    return int(seed)


class SACLI(LightningCLI):
    def add_arguments_to_parser(self, parser) -> None:
        parser.link_arguments("data.vocab_size", "model.arch.vocab_size", apply_on="instantiate")
        # one run seed drives weights (seed_everything), permutations and the data order
        parser.link_arguments("seed_everything", "model.arch.seed", compute_fn=_int_seed)
        parser.link_arguments("seed_everything", "data.init_args.seed", compute_fn=_int_seed)
        parser.set_defaults({"data": {"class_path": "sa_lightning.data.LMDataModule"}})

    def before_fit(self) -> None:
        self._steps_from_tokens()
        self._check_data_launch()

    def _check_data_launch(self) -> None:
        """Runs in every rank's process before Lightning's first barrier, so a refusal never hangs a rank."""
        dm = self.datamodule
        if not hasattr(dm, "check_launch"):
            return
        dm.check_launch(self.trainer.world_size)
        if dm.mode == "stream" and not self.trainer.fast_dev_run and self.trainer.max_steps < 0:
            raise ValueError("data.mode stream never runs out of data, so the run needs an end: set model.max_tokens "
                             "(the paper's 15B tokens) or trainer.max_steps.")

    def _prepare_subcommand_kwargs(self, subcommand: str) -> dict:
        """Checkpoints are loaded with ``weights_only=True`` unless the user asks otherwise: our checkpoints
        hold plain types only, and a checkpoint from elsewhere then cannot run code on load."""
        kwargs = super()._prepare_subcommand_kwargs(subcommand)
        if "weights_only" in kwargs and kwargs["weights_only"] is None:
            kwargs["weights_only"] = True
        return kwargs

    def _parse_ckpt_path(self) -> None:
        """A truncated or corrupt ``ckpt_path`` stops the run in one sentence (LightningCLI reads the file's
        hyperparameters right after parsing): never a traceback, never a silent fresh start."""
        from .lit.checkpoint import read_checkpoint

        subcommand = self.config.get("subcommand")
        path = self.config[subcommand].get("ckpt_path") if subcommand else None
        if path and path not in ("last", "best", "hpc", "registry"):
            read_checkpoint(path, mmap=True, weights_only=self.config[subcommand].get("weights_only") is not False)
        super()._parse_ckpt_path()

    def _steps_from_tokens(self) -> None:
        max_tokens = self.model.hparams.max_tokens
        if max_tokens is None or self.trainer.fast_dev_run:
            return
        per_step = tokens_per_step(self.trainer, self.datamodule)
        steps = steps_for_tokens(max_tokens, per_step)
        self.trainer.fit_loop.epoch_loop.max_steps = steps
        if self.trainer.is_global_zero:
            print(f"max_steps = {steps} ({max_tokens:,} tokens / {per_step:,} tokens per optimizer step)")


def run(args: list[str] | None = None, run: bool = True) -> SACLI:
    return SACLI(
        LitLM,
        L.LightningDataModule,
        subclass_mode_data=True,
        args=args,
        run=run,
        parser_kwargs={"parser_mode": "omegaconf"},
        # a requeued job writes into the same run folder: overwrite instead of failing on config.yaml
        save_config_kwargs={"overwrite": True},
        trainer_defaults={"use_distributed_sampler": False},  # the data modules shard exactly by themselves
    )
