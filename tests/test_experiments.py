"""The experiments' one contract: every experiment (the three studies, the sweep and the evaluation) runs through one
entry and writes the same files, its ``compare.json`` in one schema (``tests.helpers.check_result_contract``), and
reuses every cell on a rerun; a new experiment is one file and its YAML."""
import json
import shutil

import pytest

from sa_lightning.experiments import long_range, pretrain, reach
from tests.helpers import ROOT, check_result_contract, fit_tiny_checkpoint, run_cli_here


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


def _tiny_model(folder):
    """A tiny random Qwen3 with the embedded tokenizer, as a Hugging Face folder (the sweep's model)."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from sa_lightning.data.tokenizer import load_tokenizer

    tok = load_tokenizer("embedded")
    torch.manual_seed(0)
    Qwen3ForCausalLM(Qwen3Config(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                                 num_key_value_heads=2, head_dim=8, max_position_embeddings=512, vocab_size=len(tok),
                                 eos_token_id=tok.eos_token_id, pad_token_id=tok.eos_token_id)).save_pretrained(folder)
    tok.save_pretrained(folder)
    return str(folder)


def _study(name, module, cell, args):
    def command(tmp_path, monkeypatch):
        if cell is not None:
            monkeypatch.setattr(module.EXPERIMENT, "run_alone", cell)  # the cell, without its training
        return ["study", name, *args, "--jobs", "1"]  # in this process, where the stand-in cell function is
    return command


def _sweep(tmp_path, monkeypatch):
    return ["sweep", "--model", _tiny_model(tmp_path / "model"), "--dtype", "float32", "--tasks",
            "[shakespeare_lastword]", "--modes", "[full, swa]", "--windows", "[8]", "--limit", "5", "--comparisons",
            "[{a: full, b: swa}]"]


def _evaluate(tmp_path, monkeypatch):
    ckpt = str(fit_tiny_checkpoint(tmp_path / "ckpt"))
    return ["evaluate", "--ckpt", ckpt, ckpt, "--label", "a", "b", "--baseline", "a", "--tasks",
            "shakespeare_lastword", "--limit", "5", "--seeds", "0"]


#: every experiment, each as small as it runs: (its command line, its name, the unit its comparisons resample)
RUNS = {
    "long-range": (_study("long-range", long_range, _long_range_cell, [
        "--preset", "quick", "--variants", "full", "swa", "sa", "random", "--depths", "1", "--windows", "8",
        "--seeds", "0", "1", "2"]), "study long-range", "seeds"),
    "pretrain": (_study("pretrain", pretrain, _pretrain_cell, [
        "--models", "full", "swa@32", "sa@32", "random@32", "--seeds", "0", "1", "2", "3", "4"]), "study pretrain",
        "seeds"),
    "reach": (_study("reach", reach, None, ["--preset", "quick", "--variants", "full", "swa", "sa", "random",
                                            "--depths", "2"]), "study reach", "seeds"),
    "sweep": (_sweep, "sweep", "items"),
    "evaluate": (_evaluate, "evaluate", "items"),
}


@pytest.mark.parametrize("name", RUNS)
def test_every_experiment_writes_the_same_files_and_one_compare_schema(name, tmp_path, monkeypatch):
    command, experiment, scheme = RUNS[name]
    monkeypatch.chdir(ROOT)  # the configs' relative paths
    args = [*command(tmp_path, monkeypatch), "--out", str(tmp_path / "out")]
    out = tmp_path / "out"
    res = run_cli_here(*args)
    assert res.returncode == 0, res.stderr[-2000:]
    compared = check_result_contract(out, experiment)
    assert all(row["scheme"] == scheme for row in compared["comparisons"])
    assert json.loads((out / "results.json").read_text())["experiment"] == experiment
    again = run_cli_here(*args)  # every cell reused: its spec is equal
    cells = len(list((out / "cells").glob("*.json")))
    assert again.returncode == 0 and again.stdout.count("done before") == cells > 0, again.stdout[-2000:]
    # the folder moved, and named relative to the working directory: where it lies made none of its cells
    # (named by the worker's tmp folder as a whole: two workers' tmp_path.name can be the same)
    moved = ROOT / "outputs" / f".moved-{tmp_path.parent.name}-{tmp_path.name}"
    shutil.copytree(out, moved)
    try:
        elsewhere = run_cli_here(*args[:-2], "--out", str(moved.relative_to(ROOT)))
    finally:
        shutil.rmtree(moved)
    assert elsewhere.returncode == 0 and elsewhere.stdout.count("done before") == cells, elsewhere.stdout[-2000:]


def test_reach_measures_each_mask_beyond_swas_field(tmp_path, monkeypatch):
    """Full attention reaches every distance past L·(w−1) and SWA none (the positive control); four layers of SA
    reach nearly all of them, the stride alone only its multiples."""
    monkeypatch.chdir(ROOT)
    records = reach.main(["--preset", "quick", "--variants", "full", "swa", "sa", "strided", "--depths", "4",
                          "--seeds", "0", "1", "--out", str(tmp_path)])["records"]
    mean = {r["variant"]: sum(r["reach"]) / len(r["reach"]) for r in records if r["seed"] == 0}
    assert mean["full"] == 1.0 and mean["swa"] == 0.0
    assert mean["sa"] > 0.9 > 0.2 > mean["strided"] > 0.0
    assert len(records[0]["reach"]) == 256 - (4 * 15 + 1)  # the distances past the field


def test_a_new_experiment_is_one_file_and_its_yaml():
    """The reach experiment holds no plumbing: no parser, folder, lock, loop or writer of its own."""
    text = (ROOT / "sa_lightning" / "experiments" / "reach.py").read_text()
    assert len(text.splitlines()) <= 110, len(text.splitlines())  # its checks live in analysis.mechanism
    for plumbing in ("argparse", "folder_lock", "run_cells", "replacing_files", "write_text", "json.dump"):
        assert plumbing not in text, plumbing
