"""Training callbacks that need to know our batch layout."""
from __future__ import annotations

import os

from lightning.pytorch.callbacks import Callback, ThroughputMonitor


def last_checkpoint_path(trainer) -> str | None:
    """``last.ckpt`` next to ModelCheckpoint's files (where ``--ckpt_path last`` looks), or None without one."""
    ckpt = trainer.checkpoint_callback
    if ckpt is None or ckpt.dirpath is None:  # dirpath is resolved by ModelCheckpoint.setup
        return None
    return os.path.join(ckpt.dirpath, ckpt.CHECKPOINT_NAME_LAST + ckpt.FILE_EXTENSION)


def log_folder(trainer, name: str) -> str:
    """``<log_dir>/<name>``. ``trainer.log_dir`` broadcasts under DDP, so every rank must call this."""
    return os.path.join(trainer.log_dir or trainer.default_root_dir, name)


class EveryNSteps(Callback):
    """Base for callbacks that act every ``every_n_steps`` optimizer steps. ``on_train_batch_end`` runs
    once per micro-batch, so with gradient accumulation a step is seen several times: act once."""

    def __init__(self, every_n_steps: int):
        if every_n_steps < 0:
            raise ValueError(f"{type(self).__name__} every_n_steps must be >= 0, got {every_n_steps}.")
        self.every_n_steps = every_n_steps
        self._done_step = None

    def due(self, trainer) -> bool:
        step = trainer.global_step
        if self.every_n_steps and step > 0 and step % self.every_n_steps == 0 and step != self._done_step:
            self._done_step = step
            return True
        return False


class TokenThroughput(ThroughputMonitor):
    """Lightning's ThroughputMonitor for (B, seq_len + 1) token batches: logs samples/s, trained
    tokens/s (``items_per_sec``; Lightning sums ``length_fn`` per batch) and, on GPUs with known peak flops, MFU from ``LitLM.flops_per_batch``."""

    def __init__(self, window_size: int = 20, **kwargs):
        super().__init__(batch_size_fn=lambda batch: batch.size(0), length_fn=lambda batch: batch[:, 1:].numel(),
                         window_size=window_size, **kwargs)


class CheckpointAtEnd(Callback):
    """Writes ``last.ckpt`` (next to ModelCheckpoint's files) after the final optimizer step.

    ``max_steps`` rarely lands on a periodic checkpoint (the paper's 3815 steps against saves every
    500), and ModelCheckpoint does not save when ``max_steps`` stops an epoch midway. The file is
    written from ``on_train_batch_end``, in the same state as a periodic checkpoint, so
    ``--ckpt_path last`` resumes from it exactly.
    """

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        path = last_checkpoint_path(trainer)
        if path is None or trainer.max_steps < 1 or trainer.global_step < trainer.max_steps:
            return
        if getattr(self, "_saved_step", None) != trainer.global_step:
            trainer.save_checkpoint(path)
            self._saved_step = trainer.global_step


class ExportHF(Callback):
    """At the end of fit, writes a Hugging Face folder (``save_pretrained`` of the model and the data's
    tokenizer) for ``backbone: qwen3`` models: plain transformers loads it, and ``cli.py sweep`` patches it.

    Args:
        dirpath: the folder; default ``<log_dir>/hf``.
    """

    def __init__(self, dirpath: str | None = None):
        self.dirpath = dirpath

    def on_fit_end(self, trainer, pl_module) -> None:
        folder = self.dirpath or log_folder(trainer, "hf")
        if not trainer.is_global_zero:
            return
        if not hasattr(pl_module.net, "save_pretrained"):
            raise ValueError("ExportHF needs model.arch.backbone: qwen3; the Transformer++ has no transformers "
                             "counterpart (its output gates are not in any HF architecture).")
        pl_module.net.save_pretrained(folder, getattr(trainer.datamodule, "tokenizer", None))
        print(f"exported the Hugging Face model to {folder}", flush=True)


class SaveOnSignal(Callback):
    """On SIGTERM (preemption) or SIGUSR1 (SLURM's ``--signal=SIGUSR1@90``), finish the current batch,
    write ``last.ckpt`` next to ModelCheckpoint's files, and stop; ``--ckpt_path last`` resumes exactly.

    Lightning turns SIGTERM into a ``SIGTERMException`` at the end of the batch on every rank; this
    callback saves in ``on_exception``, so all ranks reach ``save_checkpoint``'s barrier. SIGUSR1 is
    routed the same way unless Lightning's SLURM auto-requeue already handles it (then Lightning saves
    its own ``hpc_ckpt`` and requeues).
    """

    def __init__(self, signals: tuple[str, ...] = ("SIGTERM", "SIGUSR1")):
        import signal

        for name in signals:
            if not hasattr(signal, name):
                raise ValueError(f"SaveOnSignal: unknown signal {name!r}.")
        self.signals = tuple(signals)
        self.saved: str | None = None

    def on_fit_start(self, trainer, pl_module) -> None:
        import signal

        from lightning.fabric.plugins.environments import SLURMEnvironment

        environment = trainer._accelerator_connector.cluster_environment
        if isinstance(environment, SLURMEnvironment) and environment.auto_requeue:
            return  # Lightning saves hpc_ckpt and requeues on SLURM's signal itself
        if "SIGUSR1" in self.signals and hasattr(signal, "SIGUSR1") and \
                signal.getsignal(signal.SIGUSR1) in (signal.SIG_DFL, None):
            connector = trainer._signal_connector

            def usr1(signum, frame):
                connector.received_sigterm = True  # the same clean stop as SIGTERM

            signal.signal(signal.SIGUSR1, usr1)

    def on_exception(self, trainer, pl_module, exception) -> None:
        from lightning.pytorch.utilities.exceptions import SIGTERMException

        path = last_checkpoint_path(trainer)
        if not isinstance(exception, SIGTERMException) or path is None:
            return
        trainer.save_checkpoint(path)
        self.saved = path
        if trainer.is_global_zero:
            print(f"signal received: saved {path} at step {trainer.global_step}; resume with --ckpt_path last",
                  flush=True)
