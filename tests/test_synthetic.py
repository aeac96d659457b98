"""The synthetic recall tasks, their data module, and the long-range study runner."""
import csv
import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from sa_lightning.data.synthetic import IGNORE, RecallTask, SyntheticDataModule, bucket_names, default_buckets
from tests.helpers import ROOT, run_cli_here

MQAR = RecallTask("mqar", seq_len=128, num_pairs=8, num_queries=8, num_keys=16, num_values=16, num_filler=8)
PASSKEY = RecallTask("passkey", seq_len=128, num_keys=16, num_values=16, num_filler=8)


def solve(tokens: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The perfect-information solver: for each query at t, find the last earlier occurrence p of its key
    followed by a value token, and answer tokens[p + 1]. No model: only the planted evidence."""
    answers = torch.full_like(labels, IGNORE)
    for t in torch.nonzero(labels != IGNORE).flatten().tolist():
        key = int(tokens[t])
        for p in range(t - 1, -1, -1):
            if int(tokens[p]) == key and MQAR.num_keys <= int(tokens[p + 1]) < MQAR.num_keys + MQAR.num_values:
                answers[t] = tokens[p + 1]
                break
    return answers


@pytest.mark.parametrize("task", [MQAR, PASSKEY])
def test_generator_is_deterministic_per_seed_split_and_index(task):
    a, b = task.example(0, "train", 5), task.example(0, "train", 5)
    assert all(torch.equal(a[k], b[k]) for k in a)
    for other in (task.example(1, "train", 5), task.example(0, "validation", 5), task.example(0, "train", 6)):
        assert not torch.equal(a["tokens"], other["tokens"])
    assert a["tokens"].shape == (task.seq_len + 1,) and a["labels"].shape == a["distance"].shape == (task.seq_len,)
    assert int((a["labels"] != IGNORE).sum()) == task.queries


@pytest.mark.parametrize("task", [MQAR, PASSKEY])
def test_answer_is_recoverable_only_from_the_planted_evidence(task):
    right = total = right_shuffled = 0
    gen = torch.Generator().manual_seed(0)
    for i in range(40):
        ex = task.example(0, "validation", i)
        tokens, labels = ex["tokens"], ex["labels"]
        asked = labels != IGNORE
        right += int((solve(tokens, labels)[asked] == labels[asked]).sum())
        total += int(asked.sum())
        # shuffle the evidence: every position but the queries moves, so key -> value adjacency is lost
        keep = torch.zeros(len(tokens), dtype=torch.bool)
        keep[:-1] = asked
        free = torch.nonzero(~keep).flatten()
        shuffled = tokens.clone()
        shuffled[free] = tokens[free[torch.randperm(len(free), generator=gen)]]
        right_shuffled += int((solve(shuffled, labels)[asked] == labels[asked]).sum())
    assert right == total  # the evidence determines every answer
    assert right_shuffled / total < 0.25  # without it: near chance (1/16 values)


def test_distances_are_the_key_query_gaps_and_buckets_are_right():
    for i in range(20):
        ex = MQAR.example(3, "train", i)
        tokens, labels, distance = ex["tokens"], ex["labels"], ex["distance"]
        for t in torch.nonzero(labels != IGNORE).flatten().tolist():
            p = t - int(distance[t])
            assert tokens[p] == tokens[t] and tokens[p + 1] == labels[t]  # the pair sits exactly d back
            assert 2 <= distance[t] <= MQAR.seq_len - 1
        assert (distance[labels == IGNORE] == -1).all()
    assert default_buckets(512) == [2, 16, 32, 64, 128, 256, 512]
    assert bucket_names([2, 16, 32]) == ["2-15", "16-31"]
    task = RecallTask("passkey", seq_len=512)
    got = task.bucket_of(torch.tensor([1, 2, 15, 16, 31, 255, 256, 511, 512]))
    assert got.tolist() == [-1, 0, 0, 1, 1, 4, 5, 5, -1]


def test_distances_are_drawn_evenly_over_buckets():
    task = RecallTask("passkey", seq_len=512)
    counts = np.zeros(len(task.edges) - 1)
    for i in range(600):
        d = task.example(0, "train", i)["distance"]
        counts[int(task.bucket_of(d[d >= 0])[0])] += 1
    assert counts.min() > 0.6 * counts.mean()


def test_sharding_over_two_ranks_is_disjoint_and_complete():
    shares = {}
    for split in ("train", "val"):
        seen = []
        for rank in range(2):
            dm = SyntheticDataModule(task="passkey", seq_len=32, batch_size=4, train_examples=20, val_examples=10)
            dm.trainer = SimpleNamespace(global_rank=rank, world_size=2)
            loader = dm.train_dataloader() if split == "train" else dm.val_dataloader()
            seen.append([tuple(row.tolist()) for batch in loader for row in batch["tokens"]])
        assert not set(seen[0]) & set(seen[1])
        assert len(seen[0]) == len(seen[1])
        shares[split] = seen
    assert len(shares["val"][0]) + len(shares["val"][1]) == 10


@pytest.mark.parametrize("kwargs,needle", [
    (dict(task="copy"), "unknown synthetic task 'copy'"),
    (dict(seq_len=64, buckets=[2, 16, 128]), "longer than seq_len=64"),
    (dict(seq_len=64, max_distance=100), "distance longer than seq_len"),
    (dict(num_pairs=4, num_queries=8), "cannot exceed num_pairs=4"),
    (dict(num_pairs=32, num_queries=8, num_keys=16), "too small for the key set"),
    (dict(vocab_size=100), "too small for the key and value sets"),
])
def test_bad_synthetic_settings_get_one_sentence(kwargs, needle):
    with pytest.raises(ValueError, match=needle.replace("(", r"\(")):
        SyntheticDataModule(**kwargs)


def test_bad_synthetic_setting_from_the_cli_is_one_line(tmp_path):
    res = run_cli_here("fit", "--config", str(ROOT / "configs/synthetic/mqar.yaml"), "--data.init_args.num_queries",
                       "20", "--trainer.default_root_dir", str(tmp_path))
    assert res.returncode != 0 and "cannot exceed num_pairs=16" in res.stderr and "Traceback" not in res.stderr


def test_eval_samples_average_the_probabilities_of_k_permutation_draws():
    from sa_lightning.lit import LitLM
    from sa_lightning.models import ModelConfig

    lit = LitLM(arch=ModelConfig.from_name("debug"), eval_samples=3)
    idx = torch.randint(0, 256, (2, 40))
    with torch.no_grad():
        got = lit.eval_scores(idx, -1)
        draws = torch.stack([torch.softmax(lit(idx, -3 - s), -1) for s in range(3)]).mean(0)
    torch.testing.assert_close(got.exp(), draws, rtol=1e-5, atol=1e-6)
    assert not torch.allclose(draws, torch.softmax(lit(idx, -3), -1))  # the draws differ


@pytest.mark.slow
def test_one_tiny_study_cell_runs_end_to_end(tmp_path):
    """The shipped study config, reduced in size: tables, plot and a cell that a rerun skips."""
    out = tmp_path / "study"
    args = ["study", "long-range", "--preset", "quick", "--variants", "sa", "--depths", "1", "--windows", "8",
            "--eval_samples", "1", "2", "--out", str(out), "--set", "trainer.max_steps=4",
            "--set", "data.init_args.seq_len=64", "--set", "model.arch.max_seq_len=64",
            "--set", "data.init_args.val_examples=16", "--set", "data.init_args.batch_size=8"]
    res = run_cli_here(*args)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "[1/1] passkey_sa_L1_w8_s0" in res.stdout
    rows = list(csv.DictReader((out / "results.csv").open()))
    assert [r["eval_samples"] for r in rows] == ["1", "2"] and rows[0]["receptive_field"] == "7"
    assert {"acc@2-15", "acc@32-63"} <= set(rows[0])
    assert (out / "accuracy_vs_distance.png").stat().st_size > 1000
    assert "| passkey | 1 | 8 | 7 | sa |" in (out / "table.md").read_text()
    assert "| passkey | sa | 8 |" in (out / "reach.md").read_text()
    path = out / "cells" / "passkey_sa_L1_w8_s0.json"
    cell = json.loads(path.read_text())
    assert cell["steps"] == 4
    path.write_text(path.read_text()[:200])  # what a kill mid-write left before cells were written atomically
    again = run_cli_here(*args)
    assert again.returncode == 0 and f"{path} is damaged (cut short?); running that cell again" in again.stdout
    assert json.loads(path.read_text())["steps"] == 4
    skipped = run_cli_here(*args)
    assert skipped.returncode == 0 and "done before" in skipped.stdout


@pytest.mark.slow
def test_passkey_config_with_a_swapped_variant_logs_accuracy_by_distance(tmp_path, monkeypatch):
    """What a user runs: the shipped config, the variant swapped by --model, only the size reduced."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    monkeypatch.chdir(ROOT)  # the command's relative config paths
    res = run_cli_here("fit", "--config", "configs/synthetic/passkey.yaml", "--model", "configs/model/swa.yaml",
                       "--trainer.max_steps", "3", "--trainer.val_check_interval", "3",
                       "--trainer.log_every_n_steps", "1", "--data.init_args.val_examples", "16",
                       "--data.init_args.batch_size", "8", "--trainer.default_root_dir", str(tmp_path),
                       "--trainer.logger.init_args.save_dir", str(tmp_path), "--trainer.enable_progress_bar", "false")
    assert res.returncode == 0, res.stderr[-2000:]
    events = EventAccumulator(str(next(tmp_path.glob("tb/version_*")))).Reload()
    tags = set(events.Tags()["scalars"])
    assert {"val/acc", "val/loss", "val/acc@2-15", "val/acc@128-255", "train/loss"} <= tags
    config = (next(tmp_path.glob("tb/version_*")) / "config.yaml").read_text()
    assert "variant: swa" in config and "SyntheticDataModule" in config
