"""A busy machine gets one line naming the setting (OMP_NUM_THREADS) that helps; a quiet one, or a user who chose
a thread count, gets nothing."""
import os

from sa_lightning.utils.load import busy_hint
from tests.helpers import run_cli_here


def test_the_hint_appears_only_when_the_load_exceeds_the_cores_and_no_thread_count_was_chosen():
    assert busy_hint(load=5.3, cores=2, threads="") == (
        "note: this machine is busy (load 5.3 on 2 cores); torch's threads then wait on each other, and "
        "OMP_NUM_THREADS=1 before the command can make a CPU run several times faster.")
    assert busy_hint(load=1.9, cores=2, threads="") is None
    assert busy_hint(load=5.3, cores=2, threads="1") is None


def test_heavy_commands_print_it_on_a_busy_machine(monkeypatch, tmp_path):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(os, "getloadavg", lambda: (64.0, 64.0, 64.0))
    res = run_cli_here("analyze", "connection", "--n", "64", "--window", "8", "--trials", "2", "--out", str(tmp_path))
    assert "note: this machine is busy (load 64.0 on" in res.stderr and "OMP_NUM_THREADS=1" in res.stderr
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    res = run_cli_here("analyze", "connection", "--n", "64", "--window", "8", "--trials", "2", "--out", str(tmp_path))
    assert "busy" not in res.stderr
