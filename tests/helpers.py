"""Test-only callbacks (importable by subprocess runs through PYTHONPATH)."""
from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import subprocess
import sys
import warnings
from pathlib import Path

import lightning as L
import torch
from torch.utils._python_dispatch import TorchDispatchMode


ROOT = Path(__file__).resolve().parents[1]


def run_cli(*args, cwd=ROOT, **env) -> subprocess.CompletedProcess:
    """``python cli.py *args`` in a subprocess (the shell's one-line error path), with this checkout importable."""
    return run_or_dump([sys.executable, str(ROOT / "cli.py"), *args], cwd=cwd,
                       env={**os.environ, "PYTHONPATH": str(ROOT), **env}, timeout=300)


def run_or_dump(args: list[str], *, timeout: float, env: dict, cwd=ROOT) -> subprocess.CompletedProcess:
    """``subprocess.run(args, capture_output=True, text=True)`` in a process group of its own. On a timeout every
    Python process of the group (DDP ranks, data-loader workers) first prints its threads' stacks
    (``PYTHONFAULTHANDLER`` and SIGABRT), then the test fails with their tail: a hang says where it hung."""
    import signal

    proc = subprocess.Popen(args, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**env, "PYTHONFAULTHANDLER": "1"}, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        import time

        import psutil

        try:  # one process at a time, so that their stacks do not interleave on the shared stderr
            tree = [*psutil.Process(proc.pid).children(recursive=True), psutil.Process(proc.pid)]
        except psutil.NoSuchProcess:
            tree = []
        for each in tree:
            with contextlib.suppress(psutil.NoSuchProcess):
                each.send_signal(signal.SIGABRT)
                time.sleep(0.5)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGABRT)
        try:
            out, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
        raise AssertionError(f"{' '.join(args[:4])} ... still ran after {timeout:.0f} s; the stacks of its processes "
                             f"(stdout's tail first):\n{out[-2000:]}\n---\n{err[-12000:]}") from None
    finally:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
    return subprocess.CompletedProcess(args, proc.returncode, out, err)


def run_cli_here(*args) -> subprocess.CompletedProcess:
    """``python cli.py *args`` in this process, for bad-input checks that need no process of their own: the
    shell's entry point (``main_with_clean_errors``) with ``sys.argv`` set, stdout and stderr captured, and a
    ``SystemExit`` turned into the exit code and the line Python would print. It saves the 7 s that a fresh
    interpreter spends importing Lightning and transformers. Lightning's rank-zero lines (``--ckpt_path last:
    resuming from ...``), which a process prints on stderr, land in stderr here too."""
    import contextlib
    import io
    import logging
    from unittest import mock

    from sa_lightning.main import main_with_clean_errors

    out, err, code = io.StringIO(), io.StringIO(), 0
    lightning_log, handler = logging.getLogger("lightning.pytorch"), logging.StreamHandler(err)
    lightning_log.addHandler(handler)
    try:
        with mock.patch.object(sys, "argv", ["cli.py", *args]), contextlib.redirect_stdout(out), \
                contextlib.redirect_stderr(err):
            try:
                main_with_clean_errors()
            except SystemExit as stop:
                if isinstance(stop.code, str):
                    print(stop.code, file=sys.stderr)
                    code = 1
                else:
                    code = stop.code or 0
    finally:
        lightning_log.removeHandler(handler)
    return subprocess.CompletedProcess(["cli.py", *args], code, out.getvalue(), err.getvalue())


def ddp_port() -> str:
    """A free port below Linux's ephemeral range (32768-60999) for a DDP subprocess's ``MASTER_PORT``. Without it
    the run takes a ``MASTER_PORT`` left in this process's environment by an in-process DDP run (whose store may
    still listen there), or Lightning's own pick, free at that moment but in the range from which other
    processes' connections take ports (test runs sharing a machine, ``pytest -n 2``): EADDRINUSE either way."""
    import random
    import socket

    for _ in range(200):
        port = random.randint(20000, 32000)
        with socket.socket() as probe:
            try:
                probe.bind(("", port))
            except OSError:
                continue
        return str(port)
    raise RuntimeError("no free port in 20000-32000")


def row_hashes(batch) -> list[str]:
    return [hashlib.sha1(row.numpy().tobytes()).hexdigest()[:16] for row in batch.cpu()]


class RecordBatches(L.Callback):
    """Records every training batch (as row hashes) and loss, per rank, to ``<out>/rank<r>.json``."""

    def __init__(self, out: str):
        self.out = out
        self.steps: list[dict] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.steps.append({"step": trainer.global_step, "rows": row_hashes(batch), "loss": float(outputs["loss"])})

    def on_fit_end(self, trainer, pl_module):
        self.flush(trainer)

    def flush(self, trainer):
        os.makedirs(self.out, exist_ok=True)
        with open(os.path.join(self.out, f"rank{trainer.global_rank}.json"), "w") as f:
            json.dump(self.steps, f)

    @staticmethod
    def flush_all(trainer):
        """Write what every RecordBatches has seen so far (before a kill that skips on_fit_end)."""
        for cb in trainer.callbacks:
            if isinstance(cb, RecordBatches):
                cb.flush(trainer)


class SkipUnusedWork(L.Callback):
    """Turns off the shipped config's work that a fault test never looks at: AttentionMapLogger's drawing
    (Figure 3's maps at the end of every fit, several seconds each; ``test_resume.py`` and ``test_eval.py``
    check the maps) and ZeroShotEval's loading of its tasks at the start of fit (its first evaluation, at step
    150, is past these 6-step runs). Every other shipped callback runs as configured, and so does every one
    appended after this one (a test that wants its own evaluation or maps appends them after it)."""

    def setup(self, trainer, pl_module, stage):
        from sa_lightning.lit import AttentionMapLogger, ZeroShotEval

        for cb in trainer.callbacks:
            if cb is self:
                break
            if isinstance(cb, AttentionMapLogger):
                cb.every_n_steps, cb.at_fit_end = 0, False
            elif isinstance(cb, ZeroShotEval):
                cb.every_n_steps = 0


class StopAfter(L.Callback):
    """Stops fit after ``steps`` optimizer steps, as an interruption would (checkpoints saved before it survive)."""

    def __init__(self, steps: int):
        self.steps = steps

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step >= self.steps:
            trainer.should_stop = True


class LargestTensor(TorchDispatchMode):
    """Watches every tensor an op returns and keeps the largest element count."""

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel())
        return out


class SignalAt(L.Callback):
    """Sends ``signal`` to this process after optimizer step ``step``: a deterministic preemption or kill."""

    def __init__(self, step: int, signal: str):
        self.step, self.signal = step, signal

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        import signal as sig

        if trainer.global_step == self.step:
            RecordBatches.flush_all(trainer)
            os.kill(os.getpid(), getattr(sig, self.signal))


class DumpMetrics(L.Callback):
    """Writes ``trainer.callback_metrics`` after each validation to ``<out>/val_rank<r>.json``."""

    def __init__(self, out: str):
        self.out = out

    def on_validation_end(self, trainer, pl_module):
        os.makedirs(self.out, exist_ok=True)
        metrics = {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("val/")}
        with open(os.path.join(self.out, f"val_rank{trainer.global_rank}.json"), "w") as f:
            json.dump({"step": trainer.global_step, **metrics}, f)


class KillDuringSave(L.Callback):
    """``kill -9`` of this process in the middle of writing a checkpoint: the ``nth`` save at optimizer step
    ``step`` (ModelCheckpoint saves ``stepN.ckpt``, then ``last.ckpt``). A watcher thread, started as the save
    begins, kills the process as soon as a file in the checkpoint folder appears with bytes in it or changes
    size, whichever writer (Lightning's or ours) is in use."""

    def __init__(self, step: int, nth: int = 1):
        self.step, self.nth, self.count = step, nth, 0

    def on_save_checkpoint(self, trainer, pl_module, checkpoint):
        import signal
        import threading

        if trainer.global_step != self.step:
            return
        self.count += 1
        if self.count != self.nth:
            return
        RecordBatches.flush_all(trainer)
        folder = trainer.checkpoint_callback.dirpath
        os.makedirs(folder, exist_ok=True)
        before = {e.name: e.stat().st_size for e in os.scandir(folder)}

        def watch():
            while True:
                for entry in os.scandir(folder):
                    try:
                        size = entry.stat().st_size
                    except FileNotFoundError:
                        continue
                    if (entry.name not in before and size > 0) or (entry.name in before and size != before[entry.name]):
                        os.kill(os.getpid(), signal.SIGKILL)

        threading.Thread(target=watch, daemon=True).start()


def fit_tiny_checkpoint(folder) -> "Path":
    """``cli.py fit`` of configs/tiny.yaml reduced in size (tests/configs/fast.yaml), 2 steps, in this process;
    returns the ``last.ckpt`` it writes into ``folder``."""
    import json
    from pathlib import Path

    from sa_lightning.lit.cli import run

    root, folder = Path(__file__).resolve().parents[1], Path(folder)
    run(["fit", "--config", str(root / "configs/tiny.yaml"), "--config", str(root / "tests/configs/fast.yaml"),
         "--trainer.max_steps", "2", "--trainer.default_root_dir", str(folder), "--trainer.callbacks",
         json.dumps([{"class_path": "lightning.pytorch.callbacks.ModelCheckpoint",
                      "init_args": {"dirpath": str(folder), "filename": "last", "every_n_train_steps": 2}}])])
    return folder / "last.ckpt"


@contextlib.contextmanager
def no_cache_rename_warning():
    """Fails the block if transformers warns about the KV cache's old name (``past_key_values``): 5.24 logs
    "`past_key_values`/`cache_params` are deprecated" once per process (so that memory is cleared first), and
    Qwen3/Llama raise a FutureWarning (they drop the name in 5.40)."""
    from transformers.utils import logging as hf_logging

    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append
    hf_logging.warning_once.cache_clear()
    hf_logging.get_logger("transformers").addHandler(handler)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("error", message=".*past_key_values", category=FutureWarning)
            yield
    finally:
        hf_logging.get_logger("transformers").removeHandler(handler)
    said = [r.getMessage() for r in records if "past_key_values" in r.getMessage()]
    assert not said, said


def check_result_contract(out, experiment: str, compared: bool = True) -> dict:
    """What every experiment writes (``utils.report.RESULT_FILES`` and a figure), ``compare.json`` in its one schema
    (the experiment's name; ``COMPARE_FIELDS`` first in every row, each row with a verdict) and ``results.json``
    naming the experiment. Returns ``compare.json``."""
    import json

    from sa_lightning.utils.report import COMPARE_FIELDS, RESULT_FILES

    written = {p.name for p in Path(out).iterdir() if p.is_file()}
    assert set(RESULT_FILES) <= written, written
    compare = json.loads((Path(out) / "compare.json").read_text())
    assert compare["experiment"] == experiment and (bool(compare["comparisons"]) == compared)
    for row in compare["comparisons"]:
        assert list(row)[:len(COMPARE_FIELDS)] == list(COMPARE_FIELDS) and row["verdict"], row
    assert json.loads((Path(out) / "results.json").read_text())["experiment"] == experiment
    return compare
