"""Files are whole or absent: checkpoints and results are written beside their target and renamed into place;
``--ckpt_path last`` takes the newest readable checkpoint; write errors name the path in one line.

The kill -9 mid-save runs (TMPDIR on another file system) are in tests/test_faults.py.
"""
import errno
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from sa_lightning.lit.checkpoint import AtomicCheckpointIO
from sa_lightning.models.checkpoint import read_checkpoint
from sa_lightning.lit.resume import find_last_checkpoint
from sa_lightning.utils.atomic import WriteError, partial_path, replacing
from tests.helpers import run_cli_here

ROOT = Path(__file__).resolve().parents[1]
TINY = str(ROOT / "configs/tiny.yaml")


def _dead_pid() -> int:
    proc = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    return int(proc.stdout)


def test_a_checkpoint_is_renamed_into_place_and_a_killed_writers_partial_file_is_removed(tmp_path):
    target = tmp_path / "ckpts" / "last.ckpt"
    orphan = tmp_path / "ckpts" / f".step4.{_dead_pid()}.partial.ckpt"  # what a kill -9 mid-save leaves
    orphan.parent.mkdir()
    orphan.write_bytes(b"x" * 1000)
    AtomicCheckpointIO().save_checkpoint({"global_step": 7, "w": torch.ones(3)}, target)
    assert read_checkpoint(target)["global_step"] == 7
    assert sorted(p.name for p in target.parent.iterdir()) == ["last.ckpt"]


def test_a_full_disk_during_a_save_keeps_the_old_checkpoint_and_says_so_in_one_sentence(tmp_path, monkeypatch):
    import sa_lightning.lit.checkpoint as module

    target = tmp_path / "last.ckpt"
    AtomicCheckpointIO().save_checkpoint({"global_step": 2}, target)
    before = target.read_bytes()

    def full_disk(path, mode="r", *args, **kwargs):  # the partial file exists, but every write hits ENOSPC
        Path(path).touch()
        return open("/dev/full", mode, *args, **kwargs)

    monkeypatch.setattr(module, "open", full_disk, raising=False)
    with pytest.raises(WriteError) as err:
        AtomicCheckpointIO().save_checkpoint({"global_step": 4, "w": torch.ones(10_000)}, target)
    message = str(err.value)
    assert err.value.errno == errno.ENOSPC and "\n" not in message
    assert message.startswith(f"the checkpoint {str(target)!r} could not be written (No space left on device); "
                              "nothing was replaced"), message
    assert target.read_bytes() == before and sorted(tmp_path.iterdir()) == [target]


def test_a_failed_write_leaves_the_old_result_and_no_partial_file(tmp_path):
    target = tmp_path / "table.md"
    target.write_text("old")
    with pytest.raises(RuntimeError), replacing(target) as tmp:
        tmp.write_text("half")
        raise RuntimeError("the writer failed midway")
    assert target.read_text() == "old" and not partial_path(target).exists()


def test_ckpt_path_last_skips_newer_checkpoints_that_cannot_be_read(tmp_path):
    folder = tmp_path / "tb" / "version_0" / "checkpoints"
    folder.mkdir(parents=True)
    torch.save({"global_step": 2}, folder / "step2.ckpt")
    torch.save({"global_step": 4}, folder / "step4.ckpt")
    (folder / "last.ckpt").write_bytes((folder / "step4.ckpt").read_bytes()[:100])  # truncated, and newest
    (folder / f".last.{os.getpid()}.partial.ckpt").write_bytes(b"")  # a save in progress is never a candidate
    os.utime(folder / "step2.ckpt", ns=(1, 1))
    os.utime(folder / "step4.ckpt", ns=(2, 2))
    readable = lambda p: read_checkpoint(p, mmap=True)  # noqa: E731
    path, skipped = find_last_checkpoint(tmp_path, readable=readable)
    assert path == folder / "step4.ckpt" and [p for p, _ in skipped] == [folder / "last.ckpt"]
    (folder / "step4.ckpt").write_bytes(b"garbage")
    path, skipped = find_last_checkpoint(tmp_path, readable=readable)
    assert path == folder / "step2.ckpt" and len(skipped) == 2


def test_ckpt_path_last_with_no_readable_checkpoint_refuses_instead_of_starting_afresh(tmp_path):
    folder = tmp_path / "tb" / "version_0" / "checkpoints"
    folder.mkdir(parents=True)
    (folder / "last.ckpt").write_bytes(b"PK\x03\x04 cut short")
    res = run_cli_here("fit", "--config", TINY, "--trainer.default_root_dir", str(tmp_path), "--ckpt_path", "last",
                       "--fresh_if_no_last", "true")
    line = res.stderr.strip().splitlines()[-1]
    assert res.returncode != 0 and line.startswith("error: --ckpt_path last found 1 checkpoint(s) under") and \
        "none can be read" in line, res.stderr[-2000:]


def test_a_checkpoint_folder_given_as_ckpt_path_names_the_newest_file_in_it(tmp_path):
    (tmp_path / "sub").mkdir()
    torch.save({}, tmp_path / "sub" / "step2.ckpt")
    res = run_cli_here("fit", "--config", TINY, "--trainer.default_root_dir", str(tmp_path / "run"),
                       "--ckpt_path", str(tmp_path))
    assert res.returncode != 0
    assert res.stderr.strip().splitlines()[-1] == (
        f"error: checkpoint {str(tmp_path)!r} is a folder, not a checkpoint file (the newest in it is "
        f"{str(tmp_path / 'sub' / 'step2.ckpt')!r}); pass a .ckpt file, or --ckpt_path last with "
        "--trainer.default_root_dir set to the run's folder.")


def test_a_run_folder_that_cannot_be_written_stops_fit_before_anything_starts(tmp_path, monkeypatch):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    res = run_cli_here("fit", "--config", TINY, "--trainer.default_root_dir", str(blocker / "run"))
    line = res.stderr.strip().splitlines()[-1]
    assert res.returncode != 0 and line.startswith(f"error: trainer.default_root_dir {str(blocker / 'run')!r} cannot "
                                                   "hold the run: the folder") and "(Not a directory)" in line, line

    def read_only(self, data):  # as on a read-only mount (root ignores chmod, so the test cannot make one)
        raise OSError(errno.EROFS, "Read-only file system", str(self))

    monkeypatch.setattr(Path, "write_bytes", read_only)
    res = run_cli_here("fit", "--config", TINY, "--trainer.default_root_dir", str(tmp_path / "ro"))
    line = res.stderr.strip().splitlines()[-1]
    assert "cannot hold the run" in line and "(Read-only file system); nothing was trained" in line, line
    assert not list((tmp_path / "ro").iterdir())


def test_a_system_os_error_is_one_line_that_names_the_path(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    res = run_cli_here("bench", "attention", "--lengths", "16", "--out", str(blocker / "bench"))
    assert res.returncode != 0 and "Traceback" not in res.stderr
    line = res.stderr.strip().splitlines()[-1]
    assert line.startswith("error: ") and repr(str(blocker / "bench")) in line and "Not a directory" in line, line


def test_every_shipped_trainer_config_writes_checkpoints_atomically(tmp_path):
    """The shipped configs name the plugin, and the CLI's default covers a config of the user's own."""
    import yaml

    from sa_lightning.lit.cli import run

    found = {}
    for path in sorted((ROOT / "configs").rglob("*.yaml")):
        raw = yaml.safe_load(path.read_text()) or {}
        trainer = raw.get("trainer") if "trainer" in raw else (raw if path.parent.name == "trainer" else None)
        if isinstance(trainer, dict):
            found[path.relative_to(ROOT).as_posix()] = [p.get("class_path") for p in trainer.get("plugins") or []]
    assert len(found) >= 8 and all(v == ["sa_lightning.lit.AtomicCheckpointIO"] for v in found.values()), found
    own = yaml.safe_load((ROOT / "configs/tiny.yaml").read_text())
    del own["trainer"]["plugins"]
    (tmp_path / "own.yaml").write_text(yaml.safe_dump(own))
    cli = run(["--config", str(tmp_path / "own.yaml"), "--trainer.default_root_dir", str(tmp_path)], run=False)
    assert isinstance(cli.trainer.strategy.checkpoint_io, AtomicCheckpointIO)


def test_torch_and_safetensors_reports_of_a_full_disk_are_one_sentence(tmp_path, monkeypatch):
    """Issue 51: a full disk during a checkpoint save ended in 90-100 lines from torch's zip writer (a
    RuntimeError, not an OSError), and during export in a 23-line SafetensorError. Both are the same sentence as
    any other full disk now (checked by hand on a 512 KiB tmpfs; simulated here)."""
    import shutil

    from sa_lightning.utils import atomic

    target = tmp_path / "last.ckpt"
    target.write_bytes(b"old")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: shutil._ntuple_diskusage(10, 10, 0))
    with pytest.raises(atomic.WriteError) as err:
        with atomic.replacing(target, "checkpoint", fsync=True) as tmp, open(tmp, "wb") as fh:
            fh.write(b"partial")
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598")
    assert str(err.value).startswith(f"the checkpoint {str(target)!r} could not be written (No space left on device)")
    assert target.read_bytes() == b"old" and "\n" not in str(err.value)

    class SafetensorError(Exception):
        pass

    with pytest.raises(atomic.WriteError, match=r"could not be written \(No space left on device\); nothing was "):
        with atomic.replacing_folder(tmp_path / "model", "exported model"):
            raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")
    with pytest.raises(RuntimeError, match="something else"):  # another RuntimeError is not a full disk
        with atomic.replacing(target, "checkpoint"):
            raise RuntimeError("something else")
