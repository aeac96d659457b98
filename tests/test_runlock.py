"""Two processes never fit into one run folder at once: the second is refused in one sentence (issue 33)."""
import subprocess
import sys
import textwrap

import lightning as L
import pytest

from sa_lightning.utils.runlock import RunLock


def test_a_second_holder_is_refused_and_the_lock_goes_with_its_process(tmp_path):
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sys, time
        from sa_lightning.utils.runlock import RunLock
        RunLock({str(tmp_path)!r}).acquire()
        print("held", flush=True)
        time.sleep(60)
    """)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(ValueError, match=rf"{tmp_path} is in use by pid {holder.pid} since .*; wait for it to "
                                             r"end, or pass another --trainer.default_root_dir\."):
            RunLock(tmp_path).acquire()
    finally:
        holder.kill()  # kill -9: the system drops the lock
        holder.wait()
    lock = RunLock(tmp_path)
    lock.acquire()
    lock.release()


def test_this_process_takes_over_its_own_lock_left_by_a_fit_that_raised(tmp_path):
    RunLock(tmp_path).acquire()  # never released, as after an exception that skipped teardown
    again = RunLock(tmp_path)
    again.acquire()
    again.release()


def test_fit_takes_the_lock_of_its_folder_and_refuses_a_second_fit_there(tmp_path):
    from tests.helpers import ROOT, run_cli_here

    holder = subprocess.Popen([sys.executable, "-c", "import time; from sa_lightning.utils.runlock import RunLock; "
                               f"RunLock({str(tmp_path)!r}).acquire(); print('held', flush=True); time.sleep(60)"],
                              stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"  # a fit in another process holds the folder
    try:
        res = run_cli_here("fit", "--config", str(ROOT / "configs/tiny.yaml"), "--config",
                           str(ROOT / "tests/configs/fast.yaml"), "--trainer.max_steps", "1",
                           "--trainer.default_root_dir", str(tmp_path))
    finally:
        holder.kill()
        holder.wait()
    assert res.returncode != 0 and f"{tmp_path} is in use by pid" in res.stderr.strip().splitlines()[-1]
    assert not (tmp_path / "checkpoints").exists()


class RaiseAtStart(L.Callback):
    """Fails the fit after setup, as a refused resume or a crash in the first step does."""

    def on_train_start(self, trainer, pl_module):
        raise ValueError("planned failure at the start of training")


def test_a_fit_that_raises_gives_its_folder_back(tmp_path):
    from tests.helpers import ROOT, run_cli_here

    res = run_cli_here("fit", "--config", str(ROOT / "configs/tiny.yaml"), "--config",
                       str(ROOT / "tests/configs/fast.yaml"), "--trainer.max_steps", "1",
                       "--trainer.default_root_dir", str(tmp_path),
                       "--trainer.callbacks", '[{"class_path": "tests.test_runlock.RaiseAtStart"}]')
    assert res.returncode != 0 and "planned failure at the start of training" in res.stderr
    probe = subprocess.run([sys.executable, "-c", "from sa_lightning.utils.runlock import RunLock; "
                            f"RunLock({str(tmp_path)!r}).acquire()"], capture_output=True, text=True)
    assert probe.returncode == 0, probe.stderr[-500:]  # another process may fit there now
