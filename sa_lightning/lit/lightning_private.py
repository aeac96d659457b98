"""The one module of sa_lightning that uses private names of Lightning or argparse.

Everything else goes through public APIs. Each use below is here because no public API does its job, and
``tests/test_lightning_private.py`` fails as soon as the installed Lightning (or argparse) drops or changes
one of them, and as soon as a private name turns up anywhere else in the package: an upgrade breaks a
test, not a run.

1. ``LightningCLI._parse_ckpt_path`` (``CheckpointHook``). Between ``parse_arguments`` and
   ``before_instantiate_classes`` LightningCLI reads the hyperparameters of ``--ckpt_path`` into the config,
   loading the whole file with ``torch.load(weights_only=True)``. No public hook replaces that step, and
   letting it run after ours would read the file a second time (GBs for a pre-training checkpoint), fail on
   a checkpoint trusted with ``--weights_only false``, and undo the keys a resumed run takes from the user
   (``lit/resume.py``). ``CheckpointHook`` hands the step to ``apply_checkpoint``, which ``SACLI`` overrides.
2. The ``hyper_parameters`` keys ``_instantiator`` and ``_class_path`` (``model_hparams_of``): what
   LightningCLI's instantiator stores in a checkpoint, turned into a model config as its
   ``_parse_ckpt_path`` does.
3. ``Trainer._signal_connector.received_sigterm`` (``request_stop``). ``Trainer.received_sigterm`` is
   read-only, and it is the flag Lightning's loops check after each batch (broadcast from rank 0 under
   DDP), so Ctrl-C and SIGUSR1 stop a run the way SIGTERM does (``SaveOnSignal``). Raising SIGTERM instead
   would run Lightning's handler, which under DDP also kills the launched ranks and broadcasts from inside
   a signal handler.
4. ``argparse.ArgumentParser._actions`` (``find_argument``): argparse keeps no public way to reach an
   argument once added; ``fit --help`` names the attention variants registered when the parser is built
   in the help of ``--model.arch.attention.variant`` (``lit/cli.py``).
5. The ``loops`` entry of a checkpoint (``finished_fit_loops``), its key ``_batches_that_stepped`` included: the
   progress counters of a ``fit`` that ended at its last step. An ensemble of seeds (``lit/seeds.py``) trains
   outside Lightning's loops, and each member's ``last.ckpt`` must hold the counters its seed's own fit leaves
   (the step, the epoch, the data position derived from them); Lightning has no public way to set them.
   ``tests/test_ensemble.py`` compares them with a real fit's, counter for counter. Which state a fit's
   ``last.ckpt`` holds depends on whether ``ModelCheckpoint`` saved at the last step (``saves_at_step``: its
   ``_every_n_train_steps``, which no public attribute gives).
"""
from __future__ import annotations

from lightning.pytorch.cli import LightningCLI

#: (where, name) of every private name used here, for ``tests/test_lightning_private.py``
PRIVATE_NAMES = (
    ("lightning.pytorch.cli.LightningCLI", "_parse_ckpt_path"),
    ("lightning checkpoint hyper_parameters", "_instantiator"),
    ("lightning checkpoint hyper_parameters", "_class_path"),
    ("lightning.pytorch.Trainer", "_signal_connector"),
    ("argparse.ArgumentParser", "_actions"),
    ("lightning checkpoint loops", "_batches_that_stepped"),
    ("lightning.pytorch.callbacks.ModelCheckpoint", "_every_n_train_steps"),
)


class CheckpointHook(LightningCLI):
    """LightningCLI whose checkpoint step (after parsing, before seeding and instantiation) is the public
    ``apply_checkpoint``; by default it is Lightning's own."""

    def _parse_ckpt_path(self) -> None:
        self.apply_checkpoint()

    def apply_checkpoint(self) -> None:
        """Take ``--ckpt_path``'s hyperparameters into ``self.config``: Lightning's own step unless overridden."""
        super()._parse_ckpt_path()


def model_hparams_of(ckpt: dict) -> dict:
    """A checkpoint's ``hyper_parameters`` as LightningCLI parses them into ``model`` ({} when there are none):
    without its instantiator entry, and as ``class_path`` + ``dict_kwargs`` when it names the class."""
    hparams = dict(ckpt.get("hyper_parameters") or {})
    hparams.pop("_instantiator", None)
    if hparams and "_class_path" in hparams:
        hparams = {"class_path": hparams.pop("_class_path"), "dict_kwargs": hparams}
    return hparams


def request_stop(trainer) -> None:
    """Stop ``trainer`` after the current batch as SIGTERM does: its loops raise ``SIGTERMException`` (which
    ``SaveOnSignal.on_exception`` saves on), on every rank under DDP."""
    trainer._signal_connector.received_sigterm = True


def find_argument(parser, dest: str):
    """The argparse action of ``parser`` that stores ``dest`` (``model.arch.attention.variant``), or None."""
    return next((action for action in parser._actions if action.dest == dest), None)


def saves_at_step(callback, step: int) -> bool:
    """Whether ``ModelCheckpoint`` ``callback`` saves (its periodic file, and ``last.ckpt`` with ``save_last``) when
    a batch ends at optimizer step ``step``."""
    every = int(callback._every_n_train_steps or 0)
    return every >= 1 and step % every == 0


def finished_fit_loops(trainer, steps: int, batches_per_epoch: float, validations_last_epoch: int,
                       val_batches: int, at_batch_end: bool = False) -> dict:
    """A checkpoint's ``loops`` as ``trainer`` (not fitted) would hold them from a ``fit`` of ``steps`` optimizer
    steps (one device, no gradient accumulation) that stopped at ``max_steps``, ``batches_per_epoch`` training
    batches an epoch (``math.inf``: one endless epoch), ``validations_last_epoch`` validations in the last epoch
    (Lightning counts the validation batches per epoch) and ``val_batches`` batches in the last validation (0:
    none ran). Each epoch restarts the counters of its batches, optimizer and scheduler steps.

    ``at_batch_end`` False: saved when training ended (``ModelCheckpoint.on_train_end``): the last epoch finished,
    mid-epoch too. True: saved as the last batch ended (``on_train_batch_end``: a periodic save at that step,
    ``CheckpointAtEnd``), before that step's validation: the batch and the epoch not yet counted complete, which
    Lightning completes when it resumes; the validations given are then those before the last step."""
    import math

    epochs = 1 if math.isinf(batches_per_epoch) else max(1, math.ceil(steps / batches_per_epoch))
    in_epoch = steps if math.isinf(batches_per_epoch) else steps - (epochs - 1) * int(batches_per_epoch)
    pending = int(at_batch_end)

    def counts(progress: dict, total: int, current: int, unfinished: tuple = ()) -> None:
        progress["total"] = {k: total - pending * (k in unfinished) for k in progress["total"]}
        progress["current"] = {k: current - pending * (k in unfinished) for k in progress["current"]}

    loops = {name: getattr(trainer, name).state_dict()
             for name in ("fit_loop", "validate_loop", "test_loop", "predict_loop")}
    fit = loops["fit_loop"]
    counts(fit["epoch_progress"], epochs, epochs, ("processed", "completed"))
    counts(fit["epoch_loop.batch_progress"], steps, in_epoch, ("completed",))
    fit["epoch_loop.batch_progress"]["is_last_batch"] = in_epoch == batches_per_epoch
    counts(fit["epoch_loop.scheduler_progress"], steps, in_epoch)
    optimizer = fit["epoch_loop.automatic_optimization.optim_progress"]["optimizer"]
    counts(optimizer["step"], steps, in_epoch)
    counts(optimizer["zero_grad"], steps, in_epoch)
    fit["epoch_loop.state_dict"]["_batches_that_stepped"] = steps - pending
    val = fit["epoch_loop.val_loop.batch_progress"]
    progress = {"total": validations_last_epoch * val_batches, "current": val_batches}
    for key in ("total", "current"):
        val[key] = dict.fromkeys(val[key], progress[key])
    val["is_last_batch"] = val_batches > 0
    return loops
