"""LightningCLI for sa_lightning: ``python cli.py fit|validate|test|predict --config <yaml>``.

Configs are parsed with OmegaConf (interpolation allowed). The data's vocabulary size is linked into
the model, and ``model.max_tokens`` (the paper gives its budget in tokens) becomes ``trainer.max_steps``.

``data`` is an ``LMDataModule`` unless the config names another class (``data.class_path``, e.g. the
synthetic recall tasks' ``sa_lightning.data.SyntheticDataModule``); a ``data`` section without
``class_path`` is ``LMDataModule``'s arguments, as in every text config.

Resuming (see ``lit/resume.py``): ``--ckpt_path last`` is the newest readable checkpoint under
``trainer.default_root_dir`` (last.ckpt, SLURM's hpc_ckpt, or a periodic one), and refuses when there
is none unless ``--fresh_if_no_last true``; a model setting that differs from the checkpoint's is
refused, never silently replaced by it. Checkpoints load with ``weights_only=True`` unless
``--weights_only false`` trusts them.

The private Lightning step this needs (reading ``--ckpt_path`` before instantiation) is reached through
``lit/lightning_private.py``, the one module that uses private names.
"""
from __future__ import annotations

import argparse
import os
import sys

import lightning as L
from lightning.pytorch.utilities import rank_zero_info

from .lightning_private import CheckpointHook, find_argument, model_hparams_of
from .module import LitLM
from .schedule import steps_for_tokens, tokens_per_step


def _int_seed(seed) -> int:
    if isinstance(seed, bool) or seed is None:
        raise ValueError("seed_everything must be an integer so that permutations and data order can be reproduced.")
    return int(seed)


class SACLI(CheckpointHook):
    def __init__(self, *args, note_earlier: bool = True, **kwargs) -> None:
        # a study's cell says itself what a run cut short in its folder means (``experiments.training.fit_cell``)
        self.note_earlier = note_earlier
        super().__init__(*args, **kwargs)

    def init_parser(self, **kwargs):
        """Every parser (the main one, each subcommand's) prints its help as plain text: Lightning's docstrings and
        ours are reStructuredText (``utils.help_format``)."""
        from ..utils.help_format import PlainHelpFormatter

        kwargs.setdefault("formatter_class", PlainHelpFormatter)
        return super().init_parser(**kwargs)

    def add_arguments_to_parser(self, parser) -> None:
        # a subcommand's parser (every one adds the same model arguments): its defaults tell a model key the
        # user set from one left at its default when a checkpoint is read (apply_checkpoint)
        self.model_parser = parser
        parser.link_arguments("data.vocab_size", "model.arch.vocab_size", apply_on="instantiate")
        # one run seed drives weights (seed_everything), permutations and the data order
        parser.link_arguments("seed_everything", "model.arch.seed", compute_fn=_int_seed)
        parser.link_arguments("seed_everything", "data.init_args.seed", compute_fn=_int_seed)
        parser.set_defaults({"data": {"class_path": "sa_lightning.data.LMDataModule"}})
        parser.add_argument("--fresh_if_no_last", type=bool, default=False,
                            help="with --ckpt_path last: start a new run when the run folder holds no last.ckpt yet "
                                 "(a SLURM job's first start) instead of refusing")
        _describe_variants(parser)

    def instantiate_trainer(self, **kwargs):
        """Lightning's trainer, with ``LineProgress`` in place of its progress bar when stdout is not a terminal
        (a log file, a pipe, a SLURM job): plain lines every ``log_every_n_steps`` steps and the final metrics,
        for every config, unless the config turns the bar off or names a progress bar of its own."""
        if "callbacks" not in kwargs:
            config = self.config_init.get(str(self.subcommand), self.config_init).get("trainer") or {}
            if wants_line_progress(config, self.trainer_defaults):
                from .callbacks import LineProgress

                kwargs["callbacks"] = [*_as_list(config.get("callbacks")), LineProgress()]
        return super().instantiate_trainer(**kwargs)

    def parse_arguments(self, parser, args) -> None:
        # the command line as given, to tell a model key the user named from one left at its default
        argv = sys.argv[1:] if args is None else args
        self._argv = [str(a) for a in argv] if isinstance(argv, (list, tuple)) else []
        super().parse_arguments(parser, args)
        subcommand = self.config.get("subcommand")
        if subcommand and "weights_only" in self.config[subcommand] and self.config[subcommand].weights_only is None:
            # checkpoints hold plain types only, and a checkpoint from elsewhere then cannot run code on load
            self.config[subcommand].weights_only = True

    def before_instantiate_classes(self) -> None:
        subcommand = self.config.get("subcommand")
        if subcommand:
            _check_accelerator(self.config[subcommand].trainer.get("accelerator"))
            _check_writable(_run_roots(self.config[subcommand].trainer)[0])

    def before_fit(self) -> None:
        self._steps_from_tokens()
        self._check_data_launch()
        if not self.config["fit"].get("ckpt_path") and self.note_earlier:
            line = earlier_run_line(_run_roots(self.config["fit"].trainer))
            if line:
                rank_zero_info(line)

    def before_validate(self) -> None:
        self._say_what_is_evaluated("validate")

    def before_test(self) -> None:
        self._say_what_is_evaluated("test")

    def _say_what_is_evaluated(self, subcommand: str) -> None:
        """``cli.py validate|test``: which weights are scored and where the results go, and for ``test`` of the
        shipped data modules, that its test set is the validation split. Lightning gives every Trainer a logger
        version of its own, so the results land in a new version beside the training run's, never over its
        config.yaml or eval tables."""
        ckpt = self.config[subcommand].get("ckpt_path")
        what = f"the checkpoint {ckpt}" if ckpt else "the model as configured, not a checkpoint (no --ckpt_path)"
        if self.trainer.loggers:  # log_dir broadcasts only once the processes are launched: none are yet
            where = f"results go to {self.trainer.log_dir} (a new logger version: Lightning gives every run its own)"
        else:
            where = f"no logger (trainer.logger is off): results are printed, files go under {self.trainer.default_root_dir}"
        rank_zero_info(f"cli.py {subcommand}: scoring {what}; {where}")
        if subcommand == "test" and _tests_on_validation(self.datamodule):
            rank_zero_info(f"cli.py test: the test set is {type(self.datamodule).__name__}'s validation split (it has no "
                           "test split of its own), so test/loss and test/ppl score the same data as val/loss and val/ppl")

    def _check_data_launch(self) -> None:
        """Runs in every rank's process before Lightning's first barrier, so a refusal never hangs a rank."""
        dm = self.datamodule
        if not hasattr(dm, "check_launch"):
            return
        dm.check_launch(self.trainer.world_size)
        if dm.mode == "stream" and not self.trainer.fast_dev_run and self.trainer.max_steps < 0:
            raise ValueError("data.mode stream never runs out of data, so the run needs an end: set model.max_tokens "
                             "(the paper's 15B tokens) or trainer.max_steps.")

    def apply_checkpoint(self) -> None:
        """Resolve ``last``, check the checkpoint, then take its hyperparameters as LightningCLI does.

        A truncated or corrupt ``ckpt_path`` stops the run in one sentence: never a traceback, never a silent
        fresh start. A model key the user set that differs from the checkpoint's stops it too (LightningCLI
        would silently take the checkpoint's); ``USER_WINS_ON_RESUME`` keys keep the user's value.
        """
        from ..models.checkpoint import check_lightning_checkpoint, read_checkpoint
        from .resume import USER_WINS_ON_RESUME, conflict_message, conflicts, flatten, named_model_keys

        subcommand = self.config.get("subcommand")
        if not subcommand:
            return
        cfg = self.config[subcommand]
        if cfg.get("ckpt_path") == "last":
            cfg.ckpt_path = self._resolve_last(cfg, subcommand)
        path = cfg.get("ckpt_path")
        if not path or path in ("best", "hpc", "registry"):
            return super().apply_checkpoint()
        ckpt = read_checkpoint(path, mmap=True, weights_only=cfg.get("weights_only") is not False)
        check_lightning_checkpoint(ckpt, path)  # a bare dict or state dict: one sentence before any data work
        user = flatten(_as_dict(cfg.model))
        defaults = flatten(_as_dict(self.model_parser.get_defaults().get("model")))
        saved = flatten(ckpt.get("hyper_parameters", {}))
        saved.setdefault("init_weights", None)  # checkpoints from before init_weights existed
        found = conflicts(user, defaults, saved, named_model_keys(self._argv))
        if found:
            raise ValueError(conflict_message(path, found))
        self._apply_checkpoint_hparams(subcommand, ckpt)
        cfg = self.config[subcommand]
        for key in USER_WINS_ON_RESUME:
            if key in user:
                _set(cfg.model, key, user[key])
        if "init_weights" in cfg.model:
            cfg.model.init_weights = None  # the checkpoint holds the weights (and what they started from)
        version = (ckpt.get("sa_lightning") or {}).get("log_version")
        if subcommand == "fit" and version is not None:
            _continue_logger_version(cfg.trainer, version)

    def _apply_checkpoint_hparams(self, subcommand: str, ckpt: dict) -> None:
        """What LightningCLI does with ``--ckpt_path``, from the checkpoint already mapped here: its model
        hyperparameters replace the config's (LightningCLI would read the whole file a second time)."""
        hparams = model_hparams_of(ckpt)
        if not hparams:
            return
        try:
            self.config = self.parser.parse_object({subcommand: {"model": hparams}}, self.config)
        except SystemExit:
            sys.stderr.write("Parsing of ckpt_path hyperparameters failed!\n")
            raise

    def _resolve_last(self, cfg, subcommand: str = "fit") -> str | None:
        """``--ckpt_path last``: the newest readable checkpoint of this run folder, whatever logger version
        wrote it; newer files that cannot be read are skipped with one line each. None (a fresh start) only
        with ``--fresh_if_no_last true``; otherwise no checkpoint is refused."""
        from ..models.checkpoint import read_checkpoint
        from .resume import find_last_checkpoint

        roots = _run_roots(cfg.trainer)
        path, skipped = find_last_checkpoint(*roots, readable=lambda p: read_checkpoint(p, mmap=True))
        for bad, _ in skipped:
            rank_zero_info(f"--ckpt_path last: skipping {bad}, which cannot be read (truncated or corrupt); "
                           "taking the newest checkpoint that can")
        if path is not None:
            rank_zero_info(f"--ckpt_path last: {CKPT_VERB.get(subcommand, 'resuming from')} {path}")
            return str(path)
        where = " or ".join(str(r) for r in roots)
        if skipped:
            raise ValueError(f"--ckpt_path last found {len(skipped)} checkpoint(s) under {where} and none can be read "
                             f"(the newest, {str(skipped[0][0])!r}, is truncated or corrupt), so nothing was trained; "
                             "pass an intact checkpoint file, or --trainer.default_root_dir of a new run folder.")
        if cfg.get("fresh_if_no_last"):
            rank_zero_info(f"--ckpt_path last: no checkpoint under {where} yet; starting a new run (--fresh_if_no_last)")
            return None
        raise ValueError(f"--ckpt_path last found no last.ckpt, hpc_ckpt or other .ckpt file under {where} "
                         "(trainer.default_root_dir), so nothing was trained; pass the run's --trainer.default_root_dir "
                         "or a checkpoint file, or add --fresh_if_no_last true to start a new run when there is none "
                         "yet (as a SLURM job's first start needs).")

    def _steps_from_tokens(self) -> None:
        max_tokens = self.model.hparams.max_tokens
        if max_tokens is None or self.trainer.fast_dev_run:
            return
        per_step = tokens_per_step(self.trainer, self.datamodule)
        steps = steps_for_tokens(max_tokens, per_step)
        self.trainer.fit_loop.epoch_loop.max_steps = steps
        if self.trainer.is_global_zero:
            print(f"max_steps = {steps} ({max_tokens:,} tokens / {per_step:,} tokens per optimizer step)")


#: what ``--ckpt_path last`` does with the checkpoint it finds, per subcommand
CKPT_VERB = {"fit": "resuming from", "validate": "validating", "test": "testing", "predict": "predicting with"}


def _tests_on_validation(datamodule) -> bool:
    """True for the shipped data modules, whose ``test_dataloader`` is their ``val_dataloader``: ``cli.py
    test`` then scores the validation split. A subclass with a test split of its own is not claimed."""
    from ..data import LMDataModule, SyntheticDataModule

    own = getattr(type(datamodule), "test_dataloader", None)
    return own is not None and own in (LMDataModule.test_dataloader, SyntheticDataModule.test_dataloader)


def wants_line_progress(trainer_config, trainer_defaults=None, stream=None) -> bool:
    """True when the run's output is not a terminal and it would otherwise get Lightning's default bar: the
    bar is on (``enable_progress_bar`` is not false) and no progress bar is among the callbacks."""
    from lightning.pytorch.callbacks import ProgressBar

    stream = sys.stdout if stream is None else stream
    try:
        if stream.isatty():
            return False
    except (AttributeError, ValueError):  # no isatty, or a closed stream: not a terminal
        pass
    if trainer_config.get("enable_progress_bar") is False:
        return False
    given = [*_as_list(trainer_config.get("callbacks")), *_as_list((trainer_defaults or {}).get("callbacks"))]
    return not any(isinstance(cb, ProgressBar) for cb in given)


def _as_list(value) -> list:
    return [] if value is None else list(value) if isinstance(value, (list, tuple)) else [value]


def _describe_variants(parser) -> None:
    """``fit --help`` names the attention variants, as the registry holds them when the parser is built
    (variants registered by ``register_variant`` included)."""
    from ..attention.registry import VARIANTS

    names = ", ".join(VARIANTS)
    action = find_argument(parser, "model.arch.attention.variant")
    if action is not None:
        action.help = (f"the attention variant, one of: {names} (configs/model/<variant>.yaml sets one "
                       "with its settings)")
    parser.description = "\n\n".join(filter(None, [parser.description,
                                                    f"Attention variants (--model.arch.attention.variant): {names}."]))


def _as_dict(node) -> dict:
    if node is None:
        return {}
    return node.as_dict() if hasattr(node, "as_dict") else dict(node)


def _set(node, dotted: str, value) -> None:
    *parents, leaf = dotted.split(".")
    for name in parents:
        node = node[name]
    node[leaf] = value


def earlier_run_line(roots: list[str]) -> str | None:
    """One line where a ``fit`` without ``--ckpt_path`` starts beside an earlier run of the same folder: a new run in
    a new logger version, and how to continue the earlier one instead; None where the folder holds no checkpoint."""
    from .resume import find_last_checkpoint

    path, _ = find_last_checkpoint(*roots)
    if path is None:
        return None
    return (f"cli.py fit: {roots[0]} already holds a run (its newest checkpoint: {path}); this starts a new run from "
            "step 0 beside it, in a new logger version. To continue that run instead, add --ckpt_path last.")


def _run_roots(trainer) -> list[str]:
    """Where a run's checkpoints live: ``default_root_dir`` (Lightning's ``lightning_logs`` under the working
    directory without one) and any ModelCheckpoint ``dirpath`` the config fixes."""
    roots = [trainer.get("default_root_dir") or os.path.join(os.getcwd(), "lightning_logs")]
    for cb, args in _configured(trainer.get("callbacks")):
        if "ModelCheckpoint" in str(cb.get("class_path")) and args.get("dirpath"):
            roots.append(str(args.get("dirpath")))
    return list(dict.fromkeys(map(str, roots)))


def _continue_logger_version(trainer, version) -> None:
    """Log a resumed fit into the checkpoint's logger version: TensorBoard shows one run that goes on."""
    for _, args in _configured(trainer.get("logger")):
        if "version" in args and args.get("version") is None:
            args["version"] = version


def _configured(value):
    """(entry, its init_args) for each class given as class_path/init_args in a trainer setting that holds
    one such entry or a list of them (``callbacks``, ``logger``); other values (None, True) give none."""
    for entry in value if isinstance(value, list) else [value]:
        args = entry.get("init_args") if hasattr(entry, "get") else None
        if args is not None:
            yield entry, args


def _check_writable(folder: str) -> None:
    """The run folder must take files (logs, config.yaml, checkpoints) before anything starts: a read-only
    disk, a file in the way, or a full disk stop the run in one sentence instead of a traceback later."""
    from pathlib import Path

    from ..utils.atomic import describe_os_error

    probe = Path(folder) / f".sa_lightning_probe.{os.getpid()}"
    try:
        Path(folder).mkdir(parents=True, exist_ok=True)
        probe.write_bytes(b"0" * 4096)
        probe.unlink()
    except OSError as err:
        if err.filename is None:
            err.filename = str(probe)
        raise ValueError(f"trainer.default_root_dir {folder!r} cannot hold the run: {describe_os_error(err, 'folder')}; "
                         "nothing was trained; pass a writable folder with --trainer.default_root_dir.") from None


def _check_accelerator(accelerator) -> None:
    """``--trainer.accelerator gpu`` on a machine without CUDA: one sentence instead of Lightning's traceback."""
    if isinstance(accelerator, str) and accelerator.lower() in ("gpu", "cuda"):
        import torch

        if not torch.cuda.is_available():
            raise ValueError(f"trainer.accelerator is {accelerator!r} but this machine has no CUDA GPU that PyTorch can "
                             f"use (torch.cuda.is_available() is False, torch {torch.__version__}); run on a GPU "
                             "machine, or pass --trainer.accelerator cpu (configs/trainer/cpu.yaml).")


def run(args: list[str] | None = None, run: bool = True, note_earlier: bool = True) -> SACLI:
    """``cli.py fit|validate|test|predict``: from the shell (``args`` None) LightningCLI reads ``sys.argv``.

    ``args``, from within Python (the long-range study runs one ``fit`` per cell), stand for the command
    line, so they become ``sys.argv[1:]`` while the CLI runs, as LightningCLI expects: given both, it warns
    that they may be a mistake, and Lightning's DDP launcher restarts the script with ``sys.argv``, which
    must then be this fit, not the command that called it. ``note_earlier`` False: no line about an earlier run in
    the folder (a study's cell says what that means for the study)."""
    from lightning.pytorch.utilities.exceptions import SIGTERMException

    from ..utils.yamlfile import check_yaml_arguments

    saved = sys.argv
    # its YAML files through the one loader first: a syntax error names the file, line and column (jsonargparse's
    # "Problems parsing config" names no file, and among two --config files not which)
    argv = sys.argv[1:] if args is None else args if isinstance(args, (list, tuple)) else []
    check_yaml_arguments([str(a) for a in argv])
    try:
        if args is None or not isinstance(args, (list, tuple)):
            return _make_cli(args, run, note_earlier)
        sys.argv = [saved[0] if saved else "cli.py", *(str(a) for a in args)]
        return _make_cli(None, run, note_earlier)
    except SIGTERMException:  # a SystemExit with status 0: `fit && test` would go on with a half-trained model
        raise SystemExit(STOPPED_BY_SIGNAL) from None
    except argparse.ArgumentError as err:  # jsonargparse's, with exit_on_error off: one sentence, not the usage
        raise ValueError(config_error(str(err), sys.argv[1:])) from None
    finally:
        sys.argv = saved


def config_error(message: str, argv: list[str]) -> str:
    """jsonargparse's nested report of a bad config value ("Parser key "data": ... Parser key "batch_size":
    Expected a <class 'int'>. Got value: four") as one sentence: the key's path, what it expected and got, and the
    ``--config`` file that sets it (``utils.yamlfile.config_value_error``, which the sweep's config shares)."""
    from ..utils.yamlfile import config_value_error

    return config_value_error(message, argv, "cli.py fit")


#: the exit status (1) and line of a run stopped by SIGTERM, SIGUSR1 or Ctrl-C (after ``SaveOnSignal`` saved)
STOPPED_BY_SIGNAL = "stopped by a signal before the run's end (exit status 1); resume it with --ckpt_path last."


def _make_cli(args, run: bool, note_earlier: bool = True) -> SACLI:
    return SACLI(
        LitLM,
        L.LightningDataModule,
        subclass_mode_data=True,
        args=args,
        run=run,
        # ${...} interpolation after the command line; a bad value raises (``config_error`` makes it one sentence
        # naming the file and the key) instead of printing the whole usage
        parser_kwargs={"parser_mode": "omegaconf+", "exit_on_error": False},
        # a requeued job writes into the same run folder: overwrite instead of failing on config.yaml
        save_config_kwargs={"overwrite": True},
        # the data modules shard exactly by themselves; checkpoints are atomic even in a config of the user's own
        trainer_defaults={"use_distributed_sampler": False,
                          "plugins": [{"class_path": "sa_lightning.lit.AtomicCheckpointIO"}]},
        note_earlier=note_earlier,
    )
