"""A busy machine runs with one thread and says so in one line; a quiet one, or a user who chose a thread count,
keeps torch's choice and gets nothing."""
import os

import torch

from sa_lightning.utils import load
from tests.helpers import run_cli_here


def _clear(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv(load._AUTO, raising=False)
    monkeypatch.setattr(torch, "set_num_threads", lambda n: None)  # keep this worker's threads


def test_one_thread_only_when_the_load_exceeds_the_cores_and_no_thread_count_was_chosen(monkeypatch):
    _clear(monkeypatch)
    assert load.pick_threads(load=1.9, cores=2) is None and "OMP_NUM_THREADS" not in os.environ
    assert load.pick_threads(load=5.3, cores=2) == (
        "note: this machine is busy (load 5.3 on 2 cores), so this runs with one thread (torch's threads would "
        "wait on each other; set OMP_NUM_THREADS to choose another count), and each stage, the imports first, may "
        "take about 3x its idle time before its line.")
    assert os.environ["OMP_NUM_THREADS"] == "1" and not load.user_chose_threads()
    assert load.pick_threads(load=6.0, cores=2) is not None  # its own choice is not the user's: a later look acts
    _clear(monkeypatch)
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    assert load.pick_threads(load=5.3, cores=2) is None and os.environ["OMP_NUM_THREADS"] == "2"


def test_heavy_commands_run_with_one_thread_on_a_busy_machine(monkeypatch, tmp_path):
    _clear(monkeypatch)
    monkeypatch.setattr(os, "getloadavg", lambda: (64.0, 64.0, 64.0))
    res = run_cli_here("analyze", "connection", "--n", "64", "--window", "8", "--trials", "2", "--out", str(tmp_path))
    assert "note: this machine is busy (load 64.0 on" in res.stderr and "runs with one thread" in res.stderr
    _clear(monkeypatch)
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    res = run_cli_here("analyze", "connection", "--n", "64", "--window", "8", "--trials", "2", "--out", str(tmp_path))
    assert "busy" not in res.stderr


def test_a_fit_that_becomes_busy_switches_to_one_thread(monkeypatch, capsys):
    from sa_lightning.lit import LitLM
    from sa_lightning.lit import module

    _clear(monkeypatch)
    threads = []
    monkeypatch.setattr(torch, "set_num_threads", threads.append)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    lit = LitLM(arch=module.ModelConfig.from_name("debug"))
    monkeypatch.setattr(os, "getloadavg", lambda: (0.5, 0.5, 0.5))
    for i in range(module.BUSY_CHECK_EVERY):
        lit.on_train_batch_end(None, None, i)
    assert threads == []
    monkeypatch.setattr(os, "getloadavg", lambda: (9.0, 9.0, 9.0))
    for i in range(module.BUSY_CHECK_EVERY - 1):
        lit.on_train_batch_end(None, None, i)  # not yet the batch that looks
    assert threads == []
    lit.on_train_batch_end(None, None, module.BUSY_CHECK_EVERY - 1)
    assert threads == [1] and "runs with one thread" in capsys.readouterr().err
