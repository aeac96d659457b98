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
