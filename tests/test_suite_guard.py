"""The README's test command on a busy machine (issue 66): a test that hangs fails by name, with its stack, and
its worker goes on; pytest-xdist's loadgroup scheduler does not crash (the "thread" method ended the worker)."""
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow  # a pytest run of its own, with two workers
def test_a_hanging_test_fails_named_and_the_run_goes_on(tmp_path):
    (tmp_path / "test_hang.py").write_text(
        "import time\n\n\ndef test_hangs():\n    time.sleep(60)\n\n\n"
        + "".join(f"def test_after_{i}():\n    assert True\n\n\n" for i in range(4)))
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "2", "--dist", "loadgroup", "-p",
                           "no:cacheprovider", "-c", str(ROOT / "pyproject.toml"), "--rootdir", str(tmp_path),
                           "-o", "timeout=3", "-o", "addopts=", str(tmp_path / "test_hang.py")],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out[-3000:]
    assert "FAILED test_hang.py::test_hangs - Failed: Timeout" in out and "1 failed, 4 passed" in out, out[-3000:]
    assert "INTERNALERROR" not in out and "node down" not in out, out[-3000:]


def test_a_hanging_subprocess_fails_with_the_stacks_of_its_processes():
    """``run_or_dump`` (the DDP fits' runner): a child and its own child that hang are both stopped, and each one's
    Python stack is in the failure, so a hang in CI says where it hung."""
    from tests.helpers import run_or_dump

    script = ("import subprocess, sys, time\n"
              "subprocess.Popen([sys.executable, '-c', 'import time\\ndef grandchild_waits():\\n    time.sleep(60)\\n"
              "grandchild_waits()'])\n"
              "def parent_waits():\n    time.sleep(60)\nparent_waits()\n")
    with pytest.raises(AssertionError, match="still ran after 3 s") as failed:
        run_or_dump([sys.executable, "-c", script], timeout=3, env={})
    assert "in parent_waits" in str(failed.value) and "in grandchild_waits" in str(failed.value), str(failed.value)
