"""A command's set of result files (a sweep's or a study's tables and figures, an analysis's CSV and PNG) is built
in a hidden folder beside them and moved into place once all of it is written (``utils.atomic.replacing_files``):
a full disk while writing it says so in one sentence and leaves the previous set byte for byte (issue 33)."""
import errno
import json
import os

import pytest
import torch

from sa_lightning.utils import atomic
from tests.helpers import ROOT, run_cli_here


def _files(folder) -> dict:
    """name -> bytes of every file directly in ``folder`` (cells/ and runs/ are the resumable state; the hidden
    lock file names the last run's pid)."""
    return {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file() and not p.name.startswith(".")}


def _full_disk(*args, **kwargs):
    """What matplotlib raises when the disk fills while a figure is saved."""
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(args[1]))


def _one_sentence(res, out, what, name):
    line = res.stderr.strip().splitlines()[-1]  # the lines above: progress bars, lm-eval's notes
    assert res.returncode != 0 and "Traceback" not in res.stderr, res.stderr[-2000:]
    assert line == (f"error: the {what} {str(out / name)!r} could not be written (No space left on device); nothing "
                    f"in {str(out)!r} was replaced, its previous {what} (if any) is intact; free space or pass a "
                    "writable folder, then run again."), line
    assert not [p for p in out.iterdir() if atomic.PARTIAL in p.name]  # no hidden folder left


def test_a_set_is_moved_in_whole_or_not_at_all(tmp_path):
    (tmp_path / "notes.txt").write_text("the user's")
    with atomic.replacing_files(tmp_path, "report") as tmp:
        (tmp / "a.md").write_text("old a")
        (tmp / "b.csv").write_text("old b")
    before = _files(tmp_path)
    with pytest.raises(ValueError, match="a plot that fails"):
        with atomic.replacing_files(tmp_path, "report") as tmp:
            (tmp / "a.md").write_text("new a")
            raise ValueError("a plot that fails")
    with pytest.raises(atomic.WriteError) as err:
        with atomic.replacing_files(tmp_path, "report") as tmp:
            atomic.write_text(tmp / "a.md", "new a")
            with atomic.replacing(tmp / "b.csv", "table") as partial:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(partial))
    assert str(err.value).startswith(f"the report {str(tmp_path / 'b.csv')!r} could not be written (No space left on "
                                     f"device); nothing in {str(tmp_path)!r} was replaced")
    assert _files(tmp_path) == before and sorted(before) == ["a.md", "b.csv", "notes.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [atomic.MANIFEST, "a.md", "b.csv", "notes.txt"]


@pytest.fixture(scope="module")
def tiny_qwen3(tmp_path_factory):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from sa_lightning.data.tokenizer import load_tokenizer

    folder, tok = tmp_path_factory.mktemp("qwen3"), load_tokenizer("embedded")
    torch.manual_seed(0)
    Qwen3ForCausalLM(Qwen3Config(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                                 num_key_value_heads=2, head_dim=8, max_position_embeddings=512, vocab_size=len(tok),
                                 eos_token_id=tok.eos_token_id, pad_token_id=tok.eos_token_id)).save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def test_a_full_disk_while_a_sweep_reports_keeps_the_previous_report_and_the_new_cell(tiny_qwen3, tmp_path,
                                                                                       monkeypatch):
    out = tmp_path / "sweep"

    def sweep(*modes):
        return run_cli_here("sweep", "--model", str(tiny_qwen3), "--dtype", "float32", "--device_map", "cpu",
                            "--tasks", "[shakespeare_lastword]", "--limit", "2", "--windows", "[8]",
                            "--modes", f"[{', '.join(modes)}]", "--out", str(out))

    assert sweep("full").returncode == 0
    before = _files(out)
    assert {"config.json", "results.json", "results.csv", "table.md", "average.png"} <= set(before)
    with monkeypatch.context() as m:
        m.setattr(atomic, "savefig", _full_disk)  # every figure is written through it (utils.report.save_figure)
        res = sweep("full", "swa")
    _one_sentence(res, out, "sweep report", "average.png")
    assert _files(out) == before  # the full-only report, byte for byte, config.json included
    assert (out / "cells" / "swa_w8_s0_shakespeare_lastword.json").is_file()  # the cell it ran is kept
    again = sweep("full", "swa")
    assert again.returncode == 0 and "2 cells, 2 already done, 0 to run" in again.stdout
    assert [r["mode"] for r in json.loads((out / "results.json").read_text())["rows"]] == ["full", "swa"]


def test_a_full_disk_while_a_study_reports_keeps_the_previous_tables_and_figure(tmp_path, monkeypatch):
    import sa_lightning.experiments.long_range as study

    def fake_cell(cell, spec):  # a trained cell, without the training
        buckets = {"2-15": 1.0, "16-31": 0.5, "32-63": 0.25}
        return {**cell, "seq_len": 64, "receptive_field": cell["depth"] * (cell["window"] - 1), "steps": 1,
                "train_seconds": 0.0, "seconds": 0.0, "edges": [2, 16, 32, 64],
                "scores": {1: {"acc": 0.5, "loss": 1.0, "buckets": buckets}}}

    monkeypatch.chdir(ROOT)  # the config's fit_config
    monkeypatch.setattr(study.EXPERIMENT, "run_alone", fake_cell)
    out = tmp_path / "study"

    def run(*variants):
        return run_cli_here("study", "long-range", "--preset", "quick", "--variants", *variants, "--depths", "1",
                            "--windows", "8", "--eval_samples", "1", "--out", str(out))

    assert run("swa").returncode == 0
    before = _files(out)
    assert sorted(before) == ["accuracy_vs_distance.png", "compare.json", "compare.md", "reach.md", "results.csv",
                              "results.json", "table.md"]
    with monkeypatch.context() as m:
        m.setattr(atomic, "savefig", _full_disk)
        res = run("swa", "sa")
    _one_sentence(res, out, "study report", "accuracy_vs_distance.png")
    assert _files(out) == before
    assert (out / "cells" / "passkey_sa_L1_w8_s0.json").is_file()
    assert run("swa", "sa").returncode == 0 and "| sa |" in (out / "table.md").read_text()


def test_a_full_disk_while_an_analysis_writes_keeps_its_previous_csv_and_figure(tmp_path, monkeypatch):
    import matplotlib.pyplot as plt

    def run(n):
        return run_cli_here("analyze", "coverage", "--n", str(n), "--window", "4", "--depth", "3", "--trials", "1",
                            "--sources", "4", "--out", str(tmp_path))

    assert run(32).returncode == 0
    before = _files(tmp_path)
    assert sorted(before) == ["coverage.csv", "coverage.png"]
    monkeypatch.setattr(atomic, "savefig", _full_disk)
    open_before = set(plt.get_fignums())
    _one_sentence(run(64), tmp_path, "analysis", "coverage.png")
    assert _files(tmp_path) == before
    assert set(plt.get_fignums()) <= open_before  # the figure whose write failed is closed too
