"""Training callbacks that need to know our batch layout."""
from __future__ import annotations

import os
import sys
import time

import torch
from lightning.pytorch.callbacks import Callback, ProgressBar, ThroughputMonitor


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
        super().__init__(batch_size_fn=lambda batch: _tokens(batch).size(0),
                         length_fn=lambda batch: _tokens(batch)[:, 1:].numel(), window_size=window_size, **kwargs)


def _tokens(batch):
    """The (B, seq_len + 1) tokens of a plain batch or of a labeled one (``{"tokens", ...}``: planted repeats)."""
    return batch["tokens"] if isinstance(batch, dict) else batch


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
            trainer.save_checkpoint(path, weights_only=False)  # a full checkpoint, as ModelCheckpoint's
            self._saved_step = trainer.global_step
            # ModelCheckpoint (which Lightning runs after this) would take a last.ckpt it did not write for
            # another run's and save its own as last-v1.ckpt when the final step is also a periodic one
            trainer.checkpoint_callback.last_model_path = path


class ExportHF(Callback):
    """At the end of fit, writes a Hugging Face folder (``models.export``: the model and the data's tokenizer).
    The Transformer++ becomes ``SATransformerForCausalLM`` (``sa_lightning.register_with_transformers()``,
    then ``AutoModelForCausalLM.from_pretrained``); a ``backbone: qwen3`` model a plain Qwen3 folder, which
    ``cli.py sweep`` can patch.

    Args:
        dirpath: the folder; default ``<log_dir>/hf``.
        decode: how the exported model's ``generate`` reads its cache (``dense`` or ``window``).
    """

    def __init__(self, dirpath: str | None = None, decode: str = "dense"):
        self.dirpath, self.decode = dirpath, decode

    def setup(self, trainer, pl_module, stage: str) -> None:
        from ..models.hf_config import check_decode

        if stage == "fit" and pl_module.arch.backbone == "transformer++":
            check_decode(pl_module.arch.attention.variant, self.decode)  # before training, not after

    def on_fit_end(self, trainer, pl_module) -> None:
        from ..models.export import export

        folder = self.dirpath or log_folder(trainer, "hf")
        if not trainer.is_global_zero:
            return
        export(pl_module.net, folder, getattr(trainer.datamodule, "tokenizer", None),  # the run's own folder
               source={"path": "cli.py fit", "step": trainer.global_step}, overwrite=True, decode=self.decode,
               owner=None)
        print(f"exported the Hugging Face model to {folder}", flush=True)


class SaveOnSignal(Callback):
    """On SIGTERM (preemption), SIGUSR1 (SLURM's ``--signal=SIGUSR1@90``) or Ctrl-C (SIGINT), finish the
    current batch, write ``last.ckpt`` next to ModelCheckpoint's files, and stop; ``--ckpt_path last``
    resumes exactly.

    Lightning turns SIGTERM into a ``SIGTERMException`` at the end of the batch on every rank; this
    callback saves in ``on_exception``, so all ranks reach ``save_checkpoint``'s barrier. SIGUSR1 is
    routed the same way unless Lightning's SLURM auto-requeue already handles it (then Lightning saves
    its own ``hpc_ckpt`` and requeues). The first Ctrl-C is routed the same way too; a second one stops at
    once, without saving, as Ctrl-C does elsewhere. The handlers are installed when training starts, after
    Lightning's own: a handler the user or Lightning installed is left alone, and the previous handlers come
    back when fit ends.
    """

    def __init__(self, signals: tuple[str, ...] = ("SIGTERM", "SIGUSR1", "SIGINT")):
        import signal

        for name in signals:
            if not hasattr(signal, name):
                raise ValueError(f"SaveOnSignal: unknown signal {name!r}.")
        self.signals = tuple(signals)
        self.saved: str | None = None
        self._restore: dict = {}

    def on_train_start(self, trainer, pl_module) -> None:
        """After Lightning registered its signal handlers (its SLURM auto-requeue one on SIGUSR1 included)."""
        import signal

        from .lightning_private import request_stop

        if "SIGINT" in self.signals and signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            def interrupt(signum, frame):
                request_stop(trainer)  # the same clean stop as SIGTERM
                signal.signal(signal.SIGINT, signal.default_int_handler)  # a second Ctrl-C stops at once
                os.write(2, b"\nCtrl-C: saving last.ckpt after this batch, then stopping (Ctrl-C again: stop now, "
                            b"without saving)\n")

            self._restore[signal.SIGINT] = signal.signal(signal.SIGINT, interrupt)
        # under SLURM with auto-requeue Lightning's handler holds SIGUSR1: it saves hpc_ckpt and requeues itself
        if "SIGUSR1" in self.signals and hasattr(signal, "SIGUSR1") and \
                signal.getsignal(signal.SIGUSR1) in (signal.SIG_DFL, None):
            def usr1(signum, frame):
                request_stop(trainer)  # the same clean stop as SIGTERM

            self._restore[signal.SIGUSR1] = signal.signal(signal.SIGUSR1, usr1)

    def teardown(self, trainer, pl_module, stage: str) -> None:
        import signal

        for signum, handler in self._restore.items():
            signal.signal(signum, handler)
        self._restore = {}

    def on_exception(self, trainer, pl_module, exception) -> None:
        from lightning.pytorch.utilities.exceptions import SIGTERMException

        path = last_checkpoint_path(trainer)
        if not isinstance(exception, SIGTERMException) or path is None:
            return
        trainer.save_checkpoint(path, weights_only=False)  # a full checkpoint: it resumes exactly
        self.saved = path
        if trainer.is_global_zero:
            print(f"signal received: saved {path} at step {trainer.global_step}; resume with --ckpt_path last",
                  flush=True)


class GateMeanLogger(Callback):
    """Logs each layer's mean attention-gate activation sigmoid(W_p Y_p), per path, during ``fit``.

    For an SA+SWA model that is g_sa and g_swa (Eq. 6-7, Appendix A.5), under the tags
    ``gates/sa_layer<i>`` and ``gates/swa_layer<i>``; a single-path model logs its one gate as
    ``gates/attn_layer<i>``. The means are read by forward hooks on the gate projections, over every
    validation batch of every rank (``on_validation``) and, with ``every_n_steps`` > 0, over rank 0's
    first micro-batch of every N-th training step (tags ``gates_train/...``). The hooks are attached only
    while a reading is due, and each adds one sigmoid and one sum over an activation the model computes
    anyway, so ordinary training steps pay nothing. A model without ``GatedPaths`` (the Hugging Face
    backbone) logs nothing.

    Args:
        on_validation: log the means over each validation run (not the sanity check).
        every_n_steps: also log them on one training batch every N optimizer steps; 0 turns this off.
    """

    def __init__(self, on_validation: bool = True, every_n_steps: int = 0):
        if every_n_steps < 0:
            raise ValueError(f"GateMeanLogger every_n_steps must be >= 0, got {every_n_steps}.")
        self.on_validation = on_validation
        self.every_n_steps = every_n_steps
        self._handles: list = []
        self._keys: list[tuple[int, str]] = []
        self._sums: dict[tuple[int, str], list] = {}
        self._train_step: int | None = None
        self._warned = False

    @staticmethod
    def gate_projections(net) -> list[tuple[int, str, "torch.nn.Module"]]:
        """(layer, path, projection W_p) for every GatedPaths in ``net``, in layer order."""
        from ..attention import GatedPaths

        gates = [m for m in net.modules() if isinstance(m, GatedPaths)]
        return [(layer, path, gate.gates[path]) for layer, gate in enumerate(gates) for path in gate.paths]

    def _attach(self, pl_module) -> None:
        self._sums, self._keys = {}, []
        for layer, path, projection in self.gate_projections(pl_module.net):
            def hook(module, inputs, output, key=(layer, path)):
                gate = torch.sigmoid(output.detach().float())
                total = self._sums.setdefault(key, [0.0, 0])
                total[0] = total[0] + gate.sum()
                total[1] += gate.numel()

            self._keys.append((layer, path))
            self._handles.append(projection.register_forward_hook(hook))

    def _detach(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def _means(self, trainer, across_ranks: bool) -> dict[tuple[int, str], float]:
        """Mean gate per (layer, path) from the hooks' sums; summed over every rank first when ``across_ranks``
        (one collective, which every rank joins even if it saw no batch)."""
        totals = torch.tensor([[float(self._sums.get(k, (0.0, 0))[0]), float(self._sums.get(k, (0.0, 0))[1])]
                               for k in self._keys], dtype=torch.float64)
        if across_ranks and getattr(trainer, "world_size", 1) > 1:
            totals = trainer.strategy.reduce(totals.to(trainer.strategy.root_device), reduce_op="sum").cpu()
        self._sums = {}
        return {key: (total / count).item() for key, (total, count) in zip(self._keys, totals) if count > 0}

    def _write(self, trainer, prefix: str, means: dict, step: int) -> None:
        """Straight to the loggers (which write on rank 0 only)."""
        if not means:
            if self._keys and not self._warned:
                from lightning.pytorch.utilities import rank_zero_warn

                rank_zero_warn("GateMeanLogger: the gate hooks never ran (a compiled model skips hooks attached "
                               "after compilation); no gate means were logged.")
                self._warned = True
            return
        metrics = {f"{prefix}/{path}_layer{layer}": value for (layer, path), value in sorted(means.items())}
        for logger in trainer.loggers:
            logger.log_metrics(metrics, step=step)

    # ---- validation ----------------------------------------------------------------------------
    def on_validation_epoch_start(self, trainer, pl_module) -> None:
        if self.on_validation and not trainer.sanity_checking:
            self._attach(pl_module)

    def on_validation_epoch_end(self, trainer, pl_module) -> None:
        if self._handles:
            self._detach()
            self._write(trainer, "gates", self._means(trainer, across_ranks=True), trainer.global_step)

    # ---- training ------------------------------------------------------------------------------
    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        step = trainer.global_step
        if self.every_n_steps and step % self.every_n_steps == 0 and step != self._train_step:
            self._train_step = step  # one micro-batch per optimizer step
            self._attach(pl_module)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self._handles:  # read before the update: logged at the step it was read
            self._detach()
            self._write(trainer, "gates_train", self._means(trainer, across_ranks=False), self._train_step)


class Heartbeat(Callback):
    """One line at least every ``every_s`` seconds while a run that prints nothing else trains or validates (a study's
    cell, whose fit is quiet): ``<label>: step N of M, T s``. It reads only the step counter, never a tensor, so it
    adds no host sync to the training step."""

    def __init__(self, label: str = "fit", every_s: float = 30.0):
        self.label, self.every_s = label, float(every_s)
        self._start = self._last = None

    def _beat(self, trainer, what: str) -> None:
        now = time.perf_counter()
        if self._start is None:
            self._start = self._last = now
        if now - self._last >= self.every_s and trainer.is_global_zero:
            self._last = now
            total = f" of {trainer.max_steps}" if trainer.max_steps and trainer.max_steps > 0 else ""
            print(f"{self.label}: {what} at step {trainer.global_step}{total}, {now - self._start:.0f} s", flush=True)

    def on_train_start(self, trainer, pl_module) -> None:
        self._start = self._last = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self._beat(trainer, "training")

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        self._beat(trainer, "validating")


class LineProgress(ProgressBar):
    """Progress as plain lines, for output that is not a terminal (a log file, a pipe, a SLURM job's output),
    where a live bar leaves only its last frame (``0.00it/s``). ``cli.py fit|validate|test|predict`` use it
    in place of Lightning's bar when stdout is not a terminal (``SACLI.instantiate_trainer``); in a terminal
    the bar stays. During ``fit``, on global rank 0 only:

    - every ``every_n_steps`` optimizer steps (default: the trainer's ``log_every_n_steps``), one line with the
      step, ``train/loss``, the learning rate, tokens/s (from ``train/tokens``) and optimizer steps/s over
      the steps since the previous line (validation time left out), and the time left at that pace;
    - after each validation, its ``val/*`` metrics;
    - at the end, the run's steps, time and mean speed, the last ``train/loss``, and the last validation's
      ``val/loss`` and ``val/ppl``, or a line saying that no validation ran.

    ``validate``, ``test`` and ``predict`` print no line of their own: Lightning prints their results.

    Args:
        every_n_steps: optimizer steps between lines; None: ``trainer.log_every_n_steps``.
        stream: where the lines go; None: ``sys.stdout`` at the time of writing.
    """

    def __init__(self, every_n_steps: int | None = None, stream=None):
        super().__init__()
        if every_n_steps is not None and (isinstance(every_n_steps, bool) or int(every_n_steps) < 1):
            raise ValueError(f"LineProgress every_n_steps must be a positive integer or None, got {every_n_steps!r}.")
        self.every_n_steps = None if every_n_steps is None else int(every_n_steps)
        self.stream = stream
        self._enabled = True
        self._reset()

    def _reset(self) -> None:
        self._fit_start = self._first_mark = self._mark = None  # wall times: fit's start, first step's end, window's start
        self._first_step = self._mark_step = self._seen_step = None
        self._mark_tokens = self._first_tokens = None
        self._paused = self._paused_total = 0.0  # seconds of validation inside the window / the whole fit
        self._val_start = None
        self._val_step = None  # the optimizer step of the last validation in this fit

    # ---- ProgressBar's contract ------------------------------------------------------------------
    def disable(self) -> None:
        self._enabled = False

    def enable(self) -> None:
        self._enabled = True

    @property
    def is_enabled(self) -> bool:
        return self._enabled

    @property
    def is_disabled(self) -> bool:
        return not self._enabled

    def print(self, *args, **kwargs) -> None:
        kwargs.setdefault("file", self.stream or sys.stdout)
        kwargs.setdefault("flush", True)
        print(*args, **kwargs)

    def _say(self, trainer, line: str) -> None:
        if self._enabled and trainer.is_global_zero:
            self.print(line)

    # ---- training --------------------------------------------------------------------------------
    def every(self, trainer) -> int:
        return max(1, self.every_n_steps or int(trainer.log_every_n_steps or 0) or 50)

    def on_train_start(self, trainer, pl_module) -> None:
        self._reset()
        self._fit_start = time.monotonic()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        step = trainer.global_step
        if step == self._seen_step:
            return  # a micro-batch of gradient accumulation: the optimizer has not stepped
        self._seen_step = step
        now, tokens = time.monotonic(), _metric(trainer, "train/tokens")
        if self._mark is None:  # rates are measured from the end of the first step (start-up and data loading left out)
            self._mark, self._mark_step, self._mark_tokens = now, step, tokens
            self._first_mark, self._first_step, self._first_tokens, self._paused = now, step, tokens, 0.0
            if step % self.every(trainer):
                return
        elif step % self.every(trainer):
            return
        seconds = now - self._mark - self._paused
        steps = step - self._mark_step
        parts = [_step_text(trainer, step)]
        loss = _metric(trainer, "train/loss")
        if loss is None and isinstance(outputs, dict) and "loss" in outputs:
            loss = float(outputs["loss"])
        if loss is not None:
            parts.append(f"loss {loss:.4f}")
        lr = _metric(trainer, "train/lr")  # the step's own (the scheduler has stepped since)
        lr = _learning_rate(trainer) if lr is None else lr
        if lr is not None:
            parts.append(f"lr {lr:.2e}")
        if steps > 0 and seconds > 0:
            if tokens is not None and self._mark_tokens is not None:
                parts.append(f"{(tokens - self._mark_tokens) / seconds:,.0f} tokens/s")
            parts.append(f"{_rate(steps / seconds)} it/s")
            if trainer.max_steps and trainer.max_steps > 0:
                left = (trainer.max_steps - step) * seconds / steps
                parts.append(f"{_clock(now - self._fit_start)} elapsed, ~{_clock(left)} left")
        else:
            parts.append(f"{_clock(now - self._fit_start)} elapsed")
        self._say(trainer, " | ".join(parts))
        self._mark, self._mark_step, self._mark_tokens, self._paused = now, step, tokens, 0.0

    # ---- validation inside fit -------------------------------------------------------------------
    def _fitting(self, trainer) -> bool:
        return trainer.state.fn == "fit" and not trainer.sanity_checking and self._fit_start is not None

    def on_validation_start(self, trainer, pl_module) -> None:
        if self._fitting(trainer):
            self._val_start = time.monotonic()

    def on_validation_end(self, trainer, pl_module) -> None:
        if not self._fitting(trainer) or self._val_start is None:
            return
        seconds = time.monotonic() - self._val_start
        self._paused += seconds
        self._paused_total += seconds
        self._val_start = None
        self._val_step = trainer.global_step
        metrics = _val_metrics(trainer)
        self._say(trainer, f"validation at step {trainer.global_step}: "
                           f"{' | '.join(metrics) if metrics else 'no val/ metric was logged'} ({seconds:.1f} s)")

    # ---- the end -----------------------------------------------------------------------------------
    def on_train_end(self, trainer, pl_module) -> None:
        if self._fit_start is None:
            return
        now = time.monotonic()
        step = trainer.global_step
        done = f"fit done: {_step_text(trainer, step)} in {_clock(now - self._fit_start)}"
        if self._mark is not None and step > self._first_step:
            seconds = now - self._first_mark - self._paused_total
            if seconds > 0:
                speed = [f"{_rate((step - self._first_step) / seconds)} it/s"]
                tokens = _metric(trainer, "train/tokens")
                if tokens is not None and self._first_tokens is not None:
                    speed.insert(0, f"{(tokens - self._first_tokens) / seconds:,.0f} tokens/s")
                done += f" ({', '.join(speed)} after the first step)"
        lines = [done]
        loss = _metric(trainer, "train/loss")
        if loss is not None:
            lines.append(f"final train/loss {loss:.4f}")
        if self._val_step is None:
            lines.append("val/loss, val/ppl: no validation ran during this fit (trainer.val_check_interval is past "
                         "its last step, or limit_val_batches is 0); `cli.py validate` with the same config and "
                         "--ckpt_path last scores it")
        else:
            lines.append(f"final validation (step {self._val_step}): {' | '.join(_val_metrics(trainer))}")
        for line in lines:
            self._say(trainer, line)


def _metric(trainer, name: str) -> float | None:
    value = trainer.callback_metrics.get(name)
    if value is None:
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _val_metrics(trainer) -> list[str]:
    """``val/loss`` and ``val/ppl`` first, then the other ``val/*`` metrics, as ``name value``."""
    names = [n for n in trainer.callback_metrics if n.startswith("val/")]
    first = [n for n in ("val/loss", "val/ppl") if n in names]
    out = []
    for name in first + [n for n in names if n not in first]:  # the rest in the order they were logged
        value = _metric(trainer, name)
        if value is not None:
            out.append(f"{name} {value:.4f}" if abs(value) < 100 else f"{name} {value:,.1f}")
    return out


def _learning_rate(trainer) -> float | None:
    try:
        return float(trainer.optimizers[0].param_groups[0]["lr"])
    except (AttributeError, IndexError, KeyError, TypeError, ValueError):
        return None


def _step_text(trainer, step: int) -> str:
    if trainer.max_steps and trainer.max_steps > 0:
        return f"step {step}/{trainer.max_steps}"
    return f"epoch {trainer.current_epoch} step {step}"


def _rate(per_second: float) -> str:
    """Steps per second: 2 decimals from 1 up (``1.00``), 3 significant digits below (``0.0712``)."""
    return f"{per_second:.2f}" if per_second >= 1 else f"{per_second:.3g}"


def _clock(seconds: float) -> str:
    seconds = max(0, int(round(seconds)))
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"
