"""Faults on CPU: kill -9, SIGTERM and SIGUSR1 mid-training, and corrupt checkpoints.

Every interrupted run is resumed with ``--ckpt_path last`` and must continue with exactly the batches
(row hashes) and losses of an uninterrupted run: no block repeated or skipped. The interrupted runs (signals,
kill -9) and the DDP runs are processes of their own; the reference run, the resumes and the refusals run in
this process (``run_cli_here``), which saves an interpreter start (~7 s) each.
"""
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.helpers import ddp_port, run_cli_here, run_or_dump

pytestmark = pytest.mark.slow  # every test trains, or reads the checkpoints of a run trained for the module

ROOT = Path(__file__).resolve().parents[1]
# The shipped default run, reduced in size only (tests/configs/small.yaml): its own logger, ModelCheckpoint,
# SaveOnSignal and every other callback stay; tests only append observers, and SkipUnusedWork, which turns off
# the attention-map drawing and zero-shot task loading that no fault test looks at.
BASE = ["--config", str(ROOT / "configs/tiny.yaml"), "--config", str(ROOT / "tests/configs/small.yaml")]
CKPT_DIR = Path("tb") / "version_0" / "checkpoints"  # where the shipped config's first run keeps its checkpoints


def _fit_args(root: Path, record: Path, *callbacks, ckpt_path=None, extra=()) -> list[str]:
    appended = [{"class_path": "tests.helpers.RecordBatches", "init_args": {"out": str(record)}},
                {"class_path": "tests.helpers.SkipUnusedWork"}, *callbacks]
    args = ["fit", *BASE, "--trainer.default_root_dir", str(root), "--trainer.enable_progress_bar", "false", *extra]
    args += [f"--trainer.callbacks+={json.dumps(cb)}" for cb in appended]
    return args + (["--ckpt_path", ckpt_path] if ckpt_path else [])


def _refused_here(root: Path, record: Path, ckpt_path: str):
    """A fit that must be refused before training, run in this process (``run_cli_here``: no interpreter start)."""
    return _fit_here(root, record, ckpt_path=ckpt_path)


def _fit_here(root: Path, record: Path, *callbacks, ckpt_path=None, extra=()):
    """``_fit`` in this process: for runs that neither signal nor kill themselves nor spawn ranks."""
    return run_cli_here(*_fit_args(root, record, *callbacks, ckpt_path=ckpt_path, extra=extra))


def _fit(root: Path, record: Path, *callbacks, ckpt_path=None, extra=(), env=None):
    args = [sys.executable, str(ROOT / "cli.py"), *_fit_args(root, record, *callbacks, ckpt_path=ckpt_path, extra=extra)]
    # as many threads as this process (conftest.py), so that its losses equal those of runs in this process
    return run_or_dump(args, timeout=420, env={**os.environ, "PYTHONPATH": str(ROOT),
                                               "OMP_NUM_THREADS": str(torch.get_num_threads()), **(env or {})})


@pytest.fixture(scope="module")
def uninterrupted_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("full")
    proc = _fit_here(root, root / "rec")
    assert proc.returncode == 0, proc.stderr[-3000:]
    steps = json.loads((root / "rec" / "rank0.json").read_text())
    assert len(steps) == 6
    return root, steps


@pytest.fixture(scope="module")
def uninterrupted(uninterrupted_run):
    return uninterrupted_run[1]


def _logged_steps(folder: Path, tag: str) -> list[int]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(folder))
    events.Reload()
    return sorted({e.step for e in events.Scalars(tag)})


def _resume_matches(sig, saved_step, uninterrupted, tmp_path, extra=(), reference: Path | None = None):
    """Interrupt a run with ``sig`` (a saving signal) at step 3, resume it with ``--ckpt_path last``: the resumed
    batches and losses are the uninterrupted run's from ``saved_step`` on, logged on in the same TensorBoard run."""
    first = _fit(tmp_path, tmp_path / "first", {"class_path": "tests.helpers.SignalAt",
                                                 "init_args": {"step": 3, "signal": sig}}, extra=extra)
    assert f"saved {tmp_path / CKPT_DIR / 'last.ckpt'} at step 3" in first.stdout + first.stderr, first.stderr[-3000:]
    assert first.returncode == 1 and "stopped by a signal before the run's end" in first.stderr  # `fit && test` stops
    import torch

    last = torch.load(tmp_path / CKPT_DIR / "last.ckpt", weights_only=True, map_location="cpu")
    assert last["global_step"] == saved_step
    seen = json.loads((tmp_path / "first" / "rank0.json").read_text())
    assert [s["rows"] for s in seen] == [s["rows"] for s in uninterrupted[:3]]
    rest = _fit_here(tmp_path, tmp_path / "rest", ckpt_path="last", extra=extra)
    assert rest.returncode == 0, rest.stderr[-3000:]
    assert f"--ckpt_path last: resuming from {tmp_path / CKPT_DIR / 'last.ckpt'}" in rest.stdout + rest.stderr
    resumed = json.loads((tmp_path / "rest" / "rank0.json").read_text())
    assert [s["rows"] for s in resumed] == [s["rows"] for s in uninterrupted[saved_step:]]
    assert [s["loss"] for s in resumed] == pytest.approx([s["loss"] for s in uninterrupted[saved_step:]],
                                                          rel=1e-6, abs=1e-6)
    # one TensorBoard run that goes on: no second logger version, and the loss curve has every step
    assert sorted(p.name for p in (tmp_path / "tb").iterdir()) == ["version_0"]
    if reference is not None:
        logged = _logged_steps(reference / "tb" / "version_0", "train/loss")
        assert len(logged) == len(uninterrupted)
        assert _logged_steps(tmp_path / "tb" / "version_0", "train/loss") == logged


# SIGUSR1 takes the same save path as SIGTERM; its SLURM use (save, requeue, resume) is
# tests/test_cluster.py::test_sigusr1_under_slurm_saves_requeues_and_the_requeued_job_resumes_exactly
def test_sigterm_saves_at_its_step_and_the_resume_continues_with_the_same_batches_and_losses(uninterrupted_run,
                                                                                           tmp_path):
    root, steps = uninterrupted_run
    _resume_matches("SIGTERM", 3, steps, tmp_path, reference=root)


def test_ctrl_c_saves_like_sigterm(tmp_path):
    """The first Ctrl-C (SIGINT) ends the batch, saves last.ckpt and stops, as SIGTERM does (whose resume is
    checked above); before, a KeyboardInterrupt stopped the run and saved nothing."""
    import torch

    # a run started in the background (`&` in a script, nohup) ignores Ctrl-C and its children inherit that;
    # a handler here (reset to the default in the child) gives the child the Ctrl-C of a terminal
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        first = _fit(tmp_path, tmp_path / "first", {"class_path": "tests.helpers.SignalAt",
                                                     "init_args": {"step": 3, "signal": "SIGINT"}})
    finally:
        signal.signal(signal.SIGINT, previous)
    out = first.stdout + first.stderr
    assert "Ctrl-C: saving last.ckpt after this batch" in out and \
        f"saved {tmp_path / CKPT_DIR / 'last.ckpt'} at step 3" in out, out[-3000:]
    assert torch.load(tmp_path / CKPT_DIR / "last.ckpt", weights_only=True, map_location="cpu")["global_step"] == 3
    assert first.returncode == 1, out[-3000:]


def _other_file_system(near: Path) -> Path:
    """A temporary folder on another file system than ``near`` (the cluster case: /tmp local, runs shared)."""
    import tempfile

    shm = Path("/dev/shm")
    if not shm.is_dir() or shm.stat().st_dev == near.stat().st_dev:
        pytest.skip("needs /dev/shm on another file system than the test's run folder")
    return Path(tempfile.mkdtemp(dir=shm, prefix="sa_lightning_tmpdir_"))


@pytest.mark.parametrize("nth, saved_step", [(1, 2), (2, 4)])
def test_kill_9_during_a_save_with_tmpdir_on_another_file_system_loses_nothing(nth, saved_step, uninterrupted,
                                                                               tmp_path, monkeypatch):
    """kill -9 while step 4's checkpoint (nth=1: step4.ckpt) or last.ckpt (nth=2) is being written, with
    TMPDIR on another file system: nothing checkpoint-sized is left there, and ``--ckpt_path last`` resumes
    exactly from the newest intact checkpoint. For nth=2 the test then truncates last.ckpt and makes it the
    newest file, as Lightning's copy from TMPDIR into place left it when killed: the resume skips it, says
    so, and takes step4.ckpt."""
    import shutil
    import tempfile

    tmpdir = _other_file_system(tmp_path)
    folder = tmp_path / CKPT_DIR
    try:
        first = _fit(tmp_path, tmp_path / "first", {"class_path": "tests.helpers.KillDuringSave",
                                                     "init_args": {"step": 4, "nth": nth}}, env={"TMPDIR": str(tmpdir)})
        assert first.returncode == -signal.SIGKILL, first.stderr[-3000:]
        assert list(folder.glob(".*.partial*")), "the kill did not land while a checkpoint was being written"
        assert not [p for p in tmpdir.rglob("*") if p.is_file() and p.stat().st_size > 100_000]
        if nth == 2:
            last = folder / "last.ckpt"
            last.write_bytes(last.read_bytes()[:5000])
        monkeypatch.setenv("TMPDIR", str(tmpdir))  # the resume, in this process, with the same TMPDIR
        monkeypatch.setattr(tempfile, "tempdir", None)  # gettempdir() reads TMPDIR again
        rest = _fit_here(tmp_path, tmp_path / "rest", ckpt_path="last")
        assert rest.returncode == 0, rest.stderr[-3000:]
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)
    out = rest.stdout + rest.stderr
    assert f"--ckpt_path last: resuming from {folder / ('last.ckpt' if nth == 1 else 'step4.ckpt')}" in out, out[-3000:]
    assert (f"--ckpt_path last: skipping {folder / 'last.ckpt'}, which cannot be read" in out) == (nth == 2)
    resumed = json.loads((tmp_path / "rest" / "rank0.json").read_text())
    assert [s["rows"] for s in resumed] == [s["rows"] for s in uninterrupted[saved_step:]]
    assert [s["loss"] for s in resumed] == pytest.approx([s["loss"] for s in uninterrupted[saved_step:]],
                                                          rel=1e-6, abs=1e-6)
    assert not list(folder.glob(".*.partial*"))  # the resumed run's first save removed the killed one's


def test_ckpt_path_last_refuses_an_empty_run_folder_unless_told_to_start_fresh(tmp_path):
    refused = _refused_here(tmp_path, tmp_path / "rec", "last")
    assert refused.returncode != 0
    line = refused.stderr.strip().splitlines()[-1]
    assert line.startswith("error: --ckpt_path last found no last.ckpt") and "--fresh_if_no_last true" in line, line
    assert not (tmp_path / "rec").exists()  # nothing was trained
    fresh = _fit_here(tmp_path, tmp_path / "rec", ckpt_path="last", extra=["--fresh_if_no_last", "true",
                                                                       "--trainer.max_steps", "2"])
    assert fresh.returncode == 0, fresh.stderr[-3000:]
    assert [s["step"] for s in json.loads((tmp_path / "rec" / "rank0.json").read_text())] == [1, 2]


# ---- stream mode: the paper's data config on local SlimPajama-schema shards, 2 DataLoader workers -----------
def _stream_args(folder: Path) -> list[str]:
    files = lambda glob: json.dumps({"kind": "files", "paths": [str(folder / glob)]})  # noqa: E731
    return ["--data", str(ROOT / "configs/data/slimpajama_6b.yaml"), "--data.train", files("train-*.jsonl"),
            "--data.val", files("validation-*.jsonl"), "--data.tokenizer", "embedded", "--data.seq_len", "64",
            "--data.batch_size", "4", "--data.val_blocks", "4", "--data.num_workers", "2", "--data.progress", "false"]


@pytest.fixture(scope="module")
def stream_args(tmp_path_factory):
    from sa_lightning.data.standin import write_slimpajama

    return _stream_args(write_slimpajama(tmp_path_factory.mktemp("slimpajama_stand_in"), shards=4))


def test_streamed_ddp_ranks_read_disjoint_data_resume_per_rank_and_reduce_validation(stream_args, tmp_path):
    """Two gloo ranks x 2 workers: disjoint batches; zero-shot evaluation and attention maps on rank 0 while rank 1
    waits at its barrier (no deadlock); a resume with another batch size is refused on every rank before training;
    a resume from the periodic step-2 checkpoint continues every rank with its own next batches (the kill -9
    resumes of text runs are above); val/loss over the ranks' disjoint slices equals one process's."""
    ddp = ["--trainer.strategy", "ddp", "--trainer.devices", "2", "--trainer.limit_val_batches", "1.0"]
    metrics = {"class_path": "tests.helpers.DumpMetrics", "init_args": {"out": str(tmp_path / "metrics")}}
    keep = {"class_path": "lightning.pytorch.callbacks.ModelCheckpoint",  # keeps every step's file, for step 2
            "init_args": {"dirpath": str(tmp_path / "keep"), "every_n_train_steps": 1, "save_top_k": -1}}
    # rank 0 alone evaluates (steps 2 and 4) and draws (step 4), as ZeroShotEval and AttentionMapLogger do in a run
    zero_shot = {"class_path": "sa_lightning.lit.ZeroShotEval",
                 "init_args": {"tasks": "shakespeare_lastword", "every_n_steps": 2, "limit": 2}}
    maps = {"class_path": "sa_lightning.lit.AttentionMapLogger",
            "init_args": {"every_n_steps": 4, "tokens": 12, "at_fit_end": False}}
    full = _fit(tmp_path, tmp_path / "full", metrics, keep, zero_shot, maps, extra=[*stream_args, *ddp],
                env={"MASTER_PORT": ddp_port()})
    assert full.returncode == 0, full.stderr[-3000:]
    ranks = [json.loads((tmp_path / "full" / f"rank{r}.json").read_text()) for r in (0, 1)]
    rows = [[h for s in steps for h in s["rows"]] for steps in ranks]
    assert len(rows[0]) == len(rows[1]) == 6 * 4 and len(set(rows[0])) == 6 * 4 and not set(rows[0]) & set(rows[1])
    logged = tmp_path / "tb" / "version_0"  # the shipped logger's run folder
    assert json.loads((logged / "eval" / "step2.json").read_text())["shakespeare_lastword"]["acc"] >= 0
    assert json.loads((logged / "eval" / "step4.json").read_text())
    assert sorted(p.name for p in (logged / "attention_maps").iterdir()) == ["step4.png"]
    step2 = next((tmp_path / "keep").glob("*step=2.ckpt"))
    # another batch size (and one process): with 2 workers a batch-size change once trained again on rows already
    # seen; now every difference is refused at once
    refused = _fit_here(tmp_path, tmp_path / "refused", ckpt_path=str(step2),
                        extra=[*stream_args, "--data.batch_size", "8"])
    assert refused.returncode != 0 and not (tmp_path / "refused").exists()
    assert refused.stderr.strip().splitlines()[-1] == (
        "error: the checkpoint's data stream cannot continue in this run, because data.batch_size was 4 but is 8 now; "
        "the number of ranks (trainer.devices x trainer.num_nodes) was 2 but is 1 now; resume as the checkpoint was "
        "written (--data.batch_size 4, trainer.devices x trainer.num_nodes = 2), or start a new run from its weights "
        "alone with --model.init_weights <the checkpoint> instead of --ckpt_path (a fresh data stream and optimizer).")
    rest = _fit(tmp_path, tmp_path / "rest", ckpt_path=str(step2), extra=[*stream_args, *ddp],
                env={"MASTER_PORT": ddp_port()})
    assert rest.returncode == 0, rest.stderr[-3000:]
    for r in (0, 1):
        resumed = json.loads((tmp_path / "rest" / f"rank{r}.json").read_text())
        assert [s["rows"] for s in resumed] == [s["rows"] for s in ranks[r][2:]]
    two = json.loads((tmp_path / "metrics" / "val_rank0.json").read_text())
    assert two["step"] == 6 and json.loads((tmp_path / "metrics" / "val_rank1.json").read_text()) == two
    one = run_cli_here("validate", *BASE, *stream_args, "--trainer.limit_val_batches", "1.0",
                       "--trainer.default_root_dir", str(tmp_path / "v"),
                       "--trainer.callbacks", json.dumps([{**metrics, "init_args": {"out": str(tmp_path / "one")}}]),
                       "--ckpt_path", str(tmp_path / CKPT_DIR / "last.ckpt"))
    assert one.returncode == 0, one.stderr[-3000:]
    single = json.loads((tmp_path / "one" / "val_rank0.json").read_text())
    assert single["val/loss"] == pytest.approx(two["val/loss"], rel=1e-5)


@pytest.mark.parametrize("damage", ["truncated", "garbage"])
def test_a_corrupt_checkpoint_is_refused_and_never_restarts_from_scratch(damage, uninterrupted, tmp_path):
    src = next(Path(p) for p in sorted((tmp_path.parent).glob(f"full*/{CKPT_DIR.as_posix()}/last.ckpt")))
    bad = tmp_path / "bad.ckpt"
    bad.write_bytes(src.read_bytes()[:5000] if damage == "truncated" else b"\\x00garbage" * 100)
    proc = _refused_here(tmp_path, tmp_path / "rec", str(bad))
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("error: checkpoint") and "cannot be read" in last, proc.stderr[-2000:]
    assert not (tmp_path / "rec").exists()  # no step was trained


def test_a_checkpoint_that_could_run_code_is_refused_unless_trusted(uninterrupted, tmp_path):
    import torch

    src = next(Path(p) for p in sorted((tmp_path.parent).glob(f"full*/{CKPT_DIR.as_posix()}/last.ckpt")))
    ckpt = torch.load(src, weights_only=True)
    ckpt["extra"] = os.getcwd  # a function reference: weights_only loading refuses it
    bad = tmp_path / "pickled.ckpt"
    torch.save(ckpt, bad)
    proc = _refused_here(tmp_path, tmp_path / "rec", str(bad))
    assert proc.returncode != 0
    assert "could run code when loaded" in proc.stderr.strip().splitlines()[-1], proc.stderr[-2000:]
    assert not (tmp_path / "rec").exists()
