"""The experiments' one contract: every study runs through one entry, and every experiment (the studies here, the
sweep in test_sweep_compare.py, the evaluation in test_eval.py) writes the same files, its ``compare.json`` in one
schema (``tests.helpers.check_result_contract``); a new experiment is one file and its YAML."""
import json

import pytest

from sa_lightning.experiments import long_range, pretrain, reach
from tests.helpers import ROOT, check_result_contract, run_cli_here


def _long_range_cell(cell, spec):  # a trained cell, without the training: answers beyond the field right or not
    items = [[d, int((d + cell["seed"]) % 3 > 0 or cell["variant"] == "full")] for d in range(2, 64)]
    return {**cell, "seq_len": 64, "receptive_field": cell["depth"] * (cell["window"] - 1), "steps": 1,
            "train_seconds": 0.0, "seconds": 0.0, "edges": [2, 16, 32, 64], "eval_seeds": [0],
            "scores": {1: {"acc": 0.5, "loss": 1.0, "buckets": {"2-15": 1.0, "16-31": 0.5, "32-63": 0.25},
                           "items": items, "logps": [-0.1 * (1 - hit) for _, hit in items]}}}


def _pretrain_cell(cell, spec):
    shift = {"full": 0.0, "swa@32": 0.3}.get(cell["model"], 0.1) + 0.01 * cell["seed"]
    scores = {"val_ppl": [4.0 + shift, 4.2 + shift], "shakespeare_lastword": [0.0, 100.0],
              "shakespeare_choice": [100.0, 100.0 * (cell["seed"] % 2)]}
    return {**cell, "steps": 1, "train_seconds": 0.0, "seconds": 0.0, "eval_seeds": [0], "scores": scores,
            "scores_by_eval_seed": [scores]}


RUNS = {
    "long-range": (long_range, _long_range_cell, ["--preset", "quick", "--variants", "full", "swa", "sa", "random",
                                                   "--depths", "1", "--windows", "8", "--seeds", "0", "1", "2"]),
    "pretrain": (pretrain, _pretrain_cell, ["--models", "full", "swa@32", "sa@32", "random@32", "--seeds", "0", "1",
                                            "2", "3", "4"]),
    "reach": (reach, None, ["--preset", "quick", "--variants", "full", "swa", "sa", "random", "--depths", "2"]),
}


@pytest.mark.parametrize("name", RUNS)
def test_every_experiment_writes_the_same_files_and_one_compare_schema(name, tmp_path, monkeypatch):
    module, cell, args = RUNS[name]
    monkeypatch.chdir(ROOT)  # the configs' relative paths
    if cell is not None:
        monkeypatch.setattr(module, "run_cell", cell)
    out = tmp_path / name
    args = [*args, "--jobs", "1"]  # in this process, where the stand-in cell function is
    res = run_cli_here("study", name, *args, "--out", str(out))
    assert res.returncode == 0, res.stderr[-2000:]
    assert any(p.suffix == ".png" for p in out.iterdir())
    compared = check_result_contract(out, f"study {name}")
    assert all(row["scheme"] == "seeds" for row in compared["comparisons"])
    results = json.loads((out / "results.json").read_text())
    assert results["experiment"] == f"study {name}" and results["rows"] and results["config"]["out"] == str(out)
    again = run_cli_here("study", name, *args, "--out", str(out))  # every cell reused: its spec is equal
    cells = len(list((out / "cells").glob("*.json")))
    assert again.returncode == 0 and again.stdout.count("done before") == cells > 0


def test_reach_measures_each_mask_beyond_swas_field(tmp_path, monkeypatch):
    """Full attention reaches every distance past L·(w−1) and SWA none (the positive control); four layers of SA
    reach nearly all of them, the stride alone only its multiples."""
    monkeypatch.chdir(ROOT)
    records = reach.main(["--preset", "quick", "--variants", "full", "swa", "sa", "strided", "--depths", "4",
                          "--seeds", "0", "1", "--out", str(tmp_path)])
    mean = {r["variant"]: sum(r["reach"]) / len(r["reach"]) for r in records if r["seed"] == 0}
    assert mean["full"] == 1.0 and mean["swa"] == 0.0
    assert mean["sa"] > 0.9 > 0.2 > mean["strided"] > 0.0
    assert len(records[0]["reach"]) == 256 - (4 * 15 + 1)  # the distances past the field


def test_a_new_experiment_is_one_file_and_its_yaml():
    """The reach experiment holds no plumbing: no parser, folder, lock, loop or writer of its own."""
    text = (ROOT / "sa_lightning" / "experiments" / "reach.py").read_text()
    lines = len(text.splitlines()) + len((ROOT / "configs" / "study" / "reach.yaml").read_text().splitlines())
    assert lines < 120, lines
    for plumbing in ("argparse", "folder_lock", "run_cells", "replacing_files", "write_text", "json.dump"):
        assert plumbing not in text, plumbing
