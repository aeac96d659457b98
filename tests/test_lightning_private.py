"""sa_lightning/lit/lightning_private.py is the one module that uses private names of Lightning or argparse.
These tests fail when the installed Lightning (or argparse) drops or changes one of them, and when a private
name turns up anywhere else in the package; the behaviour that rests on them is tested where it is used
(tests/test_resume.py, tests/test_faults.py, tests/test_cluster.py, tests/test_fit_output.py)."""
import inspect
import os
import re
import signal
from pathlib import Path

import pytest

from sa_lightning.lit import lightning_private as private

PACKAGE = Path(__file__).resolve().parents[1] / "sa_lightning"
#: private names that were once used around the package and now live in lightning_private.py or are gone
PRIVATE = ["_parse_ckpt_path", "_prepare_subcommand_kwargs", "_subcommand_parsers", "_signal_connector",
           "_accelerator_connector", "_sanitize_params", "_get_file_writer", "_flatten_dict", "_convert_params",
           "_TENSORBOARD_AVAILABLE", "_instantiator", "_class_path", "_actions", "_batches_that_stepped",
           "_every_n_train_steps"]
#: a private attribute of a Lightning, jsonargparse or tensorboard object, or a private Lightning import
PATTERNS = [r"\b(trainer|logger|loggers|experiment|writer|parser|cli|connector|strategy)\._[a-z]",
            r"from lightning[\w.]* import [^\n]*\b_[A-Za-z]", r"\blightning[\w.]*\._[a-z]",
            r"from jsonargparse[\w.]* import [^\n]*\b_[A-Za-z]"]


def test_the_private_cli_step_is_still_lightnings_step_between_parsing_and_instantiation():
    from lightning.pytorch.cli import LightningCLI

    assert callable(getattr(LightningCLI, "_parse_ckpt_path", None))
    init = inspect.getsource(LightningCLI.__init__)
    order = [init.find(call) for call in ("self.parse_arguments(", "self._parse_ckpt_path()",
                                          "self.before_instantiate_classes()", "self.instantiate_classes()")]
    assert -1 not in order and order == sorted(order), order
    # the hyperparameter keys model_hparams_of mirrors
    step = inspect.getsource(LightningCLI._parse_ckpt_path)
    assert '"_instantiator"' in step and '"_class_path"' in step and '"dict_kwargs"' in step
    saved = {"hyper_parameters": {"_instantiator": "x", "_class_path": "a.B", "lr": 1.0}}
    assert private.model_hparams_of(saved) == {"class_path": "a.B", "dict_kwargs": {"lr": 1.0}}
    assert private.model_hparams_of({"hyper_parameters": {"_instantiator": "x"}}) == {}
    assert private.model_hparams_of({"hyper_parameters": {"lr": 1.0}}) == {"lr": 1.0}


def test_sacli_routes_the_private_step_to_its_public_method():
    from sa_lightning.lit.cli import SACLI

    assert issubclass(SACLI, private.CheckpointHook)
    assert "apply_checkpoint" in SACLI.__dict__ and "_parse_ckpt_path" not in SACLI.__dict__


def test_request_stop_sets_the_flag_the_trainer_reads():
    import lightning as L

    trainer = L.Trainer(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False)
    assert hasattr(trainer, "_signal_connector") and trainer._signal_connector.received_sigterm is False
    private.request_stop(trainer)
    assert trainer.received_sigterm is True  # the public property Lightning's loops check


@pytest.mark.skipif(not hasattr(signal, "SIGUSR1"), reason="no SIGUSR1 here")
def test_save_on_signal_turns_sigusr1_and_ctrl_c_into_lightnings_stop():
    import lightning as L

    from sa_lightning.lit import SaveOnSignal

    trainer = L.Trainer(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False)
    before = signal.getsignal(signal.SIGUSR1), signal.getsignal(signal.SIGINT)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    callback = SaveOnSignal()
    try:
        callback.on_train_start(trainer, None)
        os.kill(os.getpid(), signal.SIGUSR1)
        assert trainer.received_sigterm is True
        trainer._signal_connector.received_sigterm = False
        os.kill(os.getpid(), signal.SIGINT)  # the first Ctrl-C stops cleanly; the second is Python's again
        assert trainer.received_sigterm is True
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
        callback.teardown(trainer, None, "fit")
        assert signal.getsignal(signal.SIGUSR1) == signal.SIG_DFL
    finally:
        signal.signal(signal.SIGUSR1, before[0])
        signal.signal(signal.SIGINT, before[1])


def test_save_on_signal_leaves_a_sigusr1_handler_it_finds_alone():
    """Lightning's SLURM auto-requeue handler is installed before training starts, so it is found there."""
    import lightning as L

    from sa_lightning.lit import SaveOnSignal

    trainer = L.Trainer(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False)

    def requeue(signum, frame):
        pass

    before = signal.signal(signal.SIGUSR1, requeue)
    try:
        callback = SaveOnSignal(signals=("SIGTERM", "SIGUSR1"))
        callback.on_train_start(trainer, None)
        assert signal.getsignal(signal.SIGUSR1) is requeue
        callback.teardown(trainer, None, "fit")
        assert signal.getsignal(signal.SIGUSR1) is requeue
    finally:
        signal.signal(signal.SIGUSR1, before)


def test_find_argument_reaches_an_added_argument():
    import argparse

    from lightning.pytorch.cli import LightningArgumentParser

    from sa_lightning.lit import LitLM

    assert isinstance(getattr(argparse.ArgumentParser(), "_actions", None), list)
    parser = LightningArgumentParser()
    parser.add_lightning_class_args(LitLM, "model")
    action = private.find_argument(parser, "model.arch.attention.variant")
    assert isinstance(action, argparse.Action) and action.dest == "model.arch.attention.variant"
    assert private.find_argument(parser, "model.no_such_key") is None


def test_private_names_are_declared_and_used_in_that_module_only():
    source = (PACKAGE / "lit" / "lightning_private.py").read_text()
    for where, name in private.PRIVATE_NAMES:
        assert name in source and name in PRIVATE, (where, name)
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "lightning_private.py":
            continue
        text = path.read_text()
        found += [(str(path.relative_to(PACKAGE)), n) for n in PRIVATE if re.search(rf"\b{n}\b", text)]
        found += [(str(path.relative_to(PACKAGE)), m.group(0)) for p in PATTERNS for m in re.finditer(p, text)]
    assert not found, found
