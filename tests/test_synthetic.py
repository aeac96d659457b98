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
    (dict(filler="zeros"), "unknown synthetic filler 'zeros'"),
    (dict(layout="zoology"), "unknown synthetic layout 'zoology'"),
    (dict(task="passkey", layout="blocked"), "use the scattered layout"),
    (dict(layout="blocked", max_distance=20), "leave it unset"),
    (dict(seq_len=128, num_pairs=33, num_queries=32, layout="blocked"), "needs 130 tokens"),
])
def test_bad_synthetic_settings_get_one_sentence(kwargs, needle):
    with pytest.raises(ValueError, match=needle.replace("(", r"\(")):
        SyntheticDataModule(**kwargs)


def test_counter_filler_scores_each_filler_token_that_follows_from_the_token_two_back():
    """filler=counters: the filler's own targets are exactly the tokens that the token two places back (plus one)
    predicts; never a query's position (its target is the answer), never a target next to a planted token."""
    task = RecallTask("mqar", seq_len=128, num_pairs=8, num_queries=6, filler="counters")
    filler0, size = task.num_keys + task.num_values, task.num_filler
    for index in range(20):
        ex = {k: v.numpy() for k, v in task.example(3, "train", index).items()}
        tokens, aux, labels = ex["tokens"], ex["aux_labels"], ex["labels"]
        scored = np.flatnonzero(aux != IGNORE)
        assert len(scored) > 64 and not (labels[scored] != IGNORE).any()
        assert (aux[scored] == tokens[scored + 1]).all()
        assert (tokens[scored - 1] >= filler0).all() and (tokens[scored + 1] >= filler0).all()
        assert ((tokens[scored - 1] - filler0 + 1) % size == tokens[scored + 1] - filler0).all()
        held = np.flatnonzero((tokens[:-2] >= filler0) & (tokens[2:] >= filler0)) + 1  # every t where the rule holds
        assert set(scored) == set(held) - set(np.flatnonzero(labels != IGNORE))
        assert (labels != IGNORE).sum() == 6  # the answers are those of random filler
    assert "aux_labels" not in RecallTask("mqar", seq_len=128, num_pairs=8, num_queries=6).example(3, "train", 0)


def test_training_adds_the_fillers_mean_loss_to_the_answers_and_validation_scores_the_answers_alone():
    from sa_lightning.lit import LitLM
    from sa_lightning.models.config import ModelConfig

    task = RecallTask("mqar", seq_len=64, num_pairs=4, num_queries=4, filler="counters")
    batch = {k: torch.stack([task.example(0, "train", i)[k] for i in range(3)]) for k in ("tokens", "labels",
                                                                                        "distance", "aux_labels")}
    lit = LitLM(arch=ModelConfig(vocab_size=task.vocab, n_layer=1, n_head=2, n_kv_head=2, d_model=32, d_ff=64,
                                 max_seq_len=64, attention={"variant": "full"}))
    scores = lit(batch["tokens"][:, :-1])
    answers, filler = LitLM.cross_entropy(scores, batch["labels"]), LitLM.cross_entropy(scores, batch["aux_labels"])
    torch.testing.assert_close(lit.loss(batch, None), answers + filler)
    plain = {k: v for k, v in batch.items() if k != "aux_labels"}
    torch.testing.assert_close(lit.loss(plain, None), answers)
    assert LitLM.targets_of(batch)[1] is batch["labels"]  # validation's targets: the answers, never the filler


def test_blocked_layout_opens_with_the_pairs_and_asks_each_queried_key_once_with_its_answer_written():
    """Zoology's layout: pair i at 2i, 2i + 1; every query after the pairs, its target the next token (the answer,
    written) and the value its key was planted with; each key queried at most once, so no query copies an answer."""
    task = RecallTask("mqar", seq_len=128, num_pairs=20, num_queries=12, layout="blocked")
    for index in range(20):
        ex = {k: v.numpy() for k, v in task.example(5, "validation", index).items()}
        tokens, labels, distance = ex["tokens"], ex["labels"], ex["distance"]
        keys, values = tokens[0:40:2], tokens[1:40:2]
        assert (keys < task.num_keys).all() and len(set(keys)) == 20 and (values >= task.num_keys).all()
        asked = np.flatnonzero(labels != IGNORE)
        assert len(asked) == 12 and asked.min() >= 40 and len(set(tokens[asked])) == 12
        assert (labels[asked] == tokens[asked + 1]).all()  # the answer is written after its query
        pair = asked - distance[asked]
        assert (pair % 2 == 0).all() and (pair < 40).all()
        assert (tokens[pair] == tokens[asked]).all() and (tokens[pair + 1] == labels[asked]).all()
        filler = np.setdiff1d(np.arange(40, 129), np.concatenate([asked, asked + 1]))
        assert len(filler) == 129 - 40 - 24 and (tokens[filler] >= task.num_keys + task.num_values).all()
    dense = RecallTask("mqar", seq_len=128, num_pairs=32, num_queries=32, layout="blocked").example(0, "train", 0)
    assert (dense["labels"] != IGNORE).sum() == 32 and dense["distance"].max() > 64


def test_a_checkpoint_of_one_filler_is_refused_by_a_run_with_the_other():
    dm = SyntheticDataModule(filler="counters")
    with pytest.raises(ValueError, match="trained with 'random' filler, not 'counters'"):
        dm.load_state_dict({"epoch": 0, "consumed": 0, "task": "mqar", "vocab_size": dm.vocab_size})
    blocked = SyntheticDataModule(layout="blocked")
    with pytest.raises(ValueError, match="trained on the 'scattered' layout, not 'blocked'"):
        blocked.load_state_dict({"epoch": 0, "consumed": 0, "task": "mqar", "filler": "random"})


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
    """The shipped study config, reduced in size: tables, plot, each cell's answers, the shipped comparison of SA
    with SWA paired answer by answer, and a cell that a rerun skips."""
    out = tmp_path / "study"
    args = ["study", "long-range", "--preset", "quick", "--variants", "sa", "swa", "--depths", "1", "--windows", "8",
            "--eval_samples", "1", "2", "--out", str(out), "--jobs", "1", "--set", "trainer.max_steps=4",
            "--set", "data.init_args.seq_len=64", "--set", "model.arch.max_seq_len=64",
            "--set", "data.init_args.val_examples=16", "--set", "data.init_args.batch_size=8"]
    res = run_cli_here(*args)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "[1/2] passkey_sa_L1_w8_s0" in res.stdout
    assert f"study long-range (preset quick): 2 cell(s), results in {out}/" in res.stdout  # said before training
    rows = list(csv.DictReader((out / "results.csv").open()))
    assert [r["eval_samples"] for r in rows if r["variant"] == "sa"] == ["1", "2"] and rows[0]["receptive_field"] == "7"
    lo, acc, hi = (float(rows[0][c]) for c in ("acc_beyond_rf_lo", "acc_beyond_rf", "acc_beyond_rf_hi"))
    assert lo <= acc <= hi
    compared = (out / "compare.md").read_text()
    assert "| passkey | 1 | 8 | 1 | 0 | sa | swa |" in compared and "| passkey | 1 | 8 | 2 | 0 | sa | swa |" in compared
    assert {"acc@2-15", "acc@32-63"} <= set(rows[0])
    assert (out / "accuracy_vs_distance.png").stat().st_size > 1000
    assert "| passkey | 1 | 8 | 7 | sa |" in (out / "table.md").read_text()
    assert "| passkey | sa | 8 |" in (out / "reach.md").read_text()
    path = out / "cells" / "passkey_sa_L1_w8_s0.json"
    cell = json.loads(path.read_text())
    assert cell["steps"] == 4 and len(cell["scores"]["1"]["items"]) == 16  # one answer per validation sequence
    # the answer's log-probability beside each answer (the continuous outcome), a probability's log at most 0
    logps = cell["scores"]["1"]["logps"]
    assert len(logps) == 16 and all(lp <= 0 for lp in logps)
    assert isinstance(cell["curve"], list)  # validations during training, read back from TensorBoard
    # the quick preset's two σ seeds at K = 1: each answer their mean, each seed's answers kept, the spread shown
    assert cell["eval_seeds"] == [0, 1] and len(cell["scores"]["1"]["hits_by_eval_seed"]) == 2
    assert "hits_by_eval_seed" not in cell["scores"]["2"] and "(2 σ)" in (out / "table.md").read_text()
    path.write_text(path.read_text()[:200])  # what a kill mid-write left before cells were written atomically
    again = run_cli_here(*args)
    assert again.returncode == 0 and f"{path} is damaged (cut short?); running that cell again" in again.stdout
    # the study says what the earlier run in the cell's folder means; fit's advice to a user (--ckpt_path last) is not
    assert "passkey_sa_L1_w8_s0: its folder holds an earlier run of this cell" in again.stdout
    assert "--ckpt_path last" not in again.stdout + again.stderr
    assert json.loads(path.read_text())["steps"] == 4
    skipped = run_cli_here(*args)
    assert skipped.returncode == 0 and "done before" in skipped.stdout
    # scoring changed, training not: both models come back from their checkpoints, nothing trains
    checkpoints = list((out / "runs" / "passkey_sa_L1_w8_s0").glob("tb/version_*/checkpoints/last.ckpt"))
    written = {c: c.stat().st_mtime_ns for c in checkpoints}  # the damaged record's rerun trained a version_1
    rescored = run_cli_here(*[a if a != "2" else "4" for a in args])  # --eval_samples 1 4
    assert rescored.returncode == 0, rescored.stderr[-2000:]
    assert rescored.stdout.count("trained before with the same fit arguments; scored again") == 2
    assert {c: c.stat().st_mtime_ns for c in checkpoints} == written
    cell = json.loads(path.read_text())
    assert sorted(cell["scores"]) == ["1", "4"] and cell["steps"] == 4


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
    events = EventAccumulator(str(next(tmp_path.glob("tb/version_*"))), size_guidance={"tensors": 0}).Reload()
    tags = set(events.Tags()["scalars"])
    assert {"val/acc", "val/loss", "val/acc@2-15", "val/acc@128-255", "train/loss"} <= tags
    # val/acc, logged by the config's DistanceAccuracy callback, is a column of the HPARAMS tab
    from tensorboard.plugins.hparams import plugin_data_pb2

    content = events.PluginTagToContent("hparams")["_hparams_/experiment"]
    experiment = plugin_data_pb2.HParamsPluginData.FromString(content).experiment
    assert {"val/acc", "val/loss", "train/loss"} <= {m.name.tag for m in experiment.metric_infos}
    config = (next(tmp_path.glob("tb/version_*")) / "config.yaml").read_text()
    assert "variant: swa" in config and "SyntheticDataModule" in config


def test_the_powered_presets_give_the_references_fewer_seeds_and_refuse_an_unknown_variant(monkeypatch):
    """Issue 49's design: 10 training seeds of each compared variant, 5 of Full and SWA (seeds_by_variant)."""
    from sa_lightning.experiments.long_range import EXPERIMENT

    cells = EXPERIMENT.cells
    monkeypatch.chdir(ROOT)
    config = "configs/study/long_range.yaml"
    todo = cells(EXPERIMENT.load(config, "powered", {}))
    count = {v: sum(c["variant"] == v for c in todo) for v in {c["variant"] for c in todo}}
    assert count == {"full": 5, "swa": 5, "sa": 10, "random": 10, "sa_swa": 10, "random_swa": 10, "strided": 10,
                     "sa_bucket": 10}
    deeper = cells(EXPERIMENT.load(config, "powered-l4", {}))
    assert {c["depth"] for c in deeper} == {4} and len(deeper) == 5 * 10 + 2 * 5
    presets = ("pilot", "powered", "powered-l4", "mqar-pilot", "mqar", "mqar-replication", "gpu", "gpu-mqar")
    outs = {p: EXPERIMENT.load(config, p, {}).out for p in presets}
    assert len(set(outs.values())) == len(presets)
    with pytest.raises(ValueError, match="seeds_by_variant names moba"):
        EXPERIMENT.load(config, "powered", {"seeds_by_variant": {"moba": [0]}})
    # MQAR's powered presets train with the token shift; its pilot shares the powered folder, so its cells are reused
    mqar, pilot = EXPERIMENT.load(config, "mqar", {}), EXPERIMENT.load(config, "mqar-shift-pilot", {})
    assert mqar.fit_overrides["model.arch.token_shift"] is True and pilot.fit_overrides == mqar.fit_overrides
    assert pilot.out == mqar.out and {(c["variant"], c["seed"]) for c in cells(pilot)} <= {
        (c["variant"], c["seed"]) for c in cells(mqar)}
    assert EXPERIMENT.load(config, "gpu-mqar", {}).fit_overrides["model.arch.token_shift"] is True
    # --variants full narrows the grid: the preset's seeds for SWA drop out with SWA, Full keeps its own five
    narrowed = cells(EXPERIMENT.load(config, "powered", {"variants": ["full"]}))
    assert sorted(c["seed"] for c in narrowed) == [0, 1, 2, 3, 4] and {c["variant"] for c in narrowed} == {"full"}
    # --seeds narrows every variant: seed 7 is one of SA's ten and none of the references' five
    seven = cells(EXPERIMENT.load(config, "powered", {"seeds": [0, 7]}))
    assert sorted(c["seed"] for c in seven if c["variant"] == "full") == [0]
    assert sorted(c["seed"] for c in seven if c["variant"] == "sa") == [0, 7]


def test_a_learning_curve_and_the_step_a_seed_learned_at_come_from_its_validations(tmp_path):
    from torch.utils.tensorboard import SummaryWriter

    from sa_lightning.eval.recall import learned_step, learning_curve

    writer = SummaryWriter(str(tmp_path / "tb" / "version_0"))
    for step, (near, far) in zip((100, 200, 300), ((0.5, 0.2), (0.95, 0.85), (1.0, 0.97))):
        writer.add_scalar("val/acc@32-63", near, step)
        writer.add_scalar("val/acc@64-127", far, step)
    writer.close()
    curve = learning_curve(tmp_path / "tb", ["32-63", "64-127"])
    assert curve == [[100, 0.35], [200, 0.9], [300, 0.985]]
    assert learned_step({"curve": curve}) == 200 and learned_step({"curve": curve[:1]}) is None


def test_each_preset_has_its_own_default_output_folder(monkeypatch):
    """A quick run must not overwrite the full study's cells and tables: the README names all three folders."""
    from sa_lightning.experiments.long_range import EXPERIMENT

    monkeypatch.chdir(ROOT)  # the config's relative fit_config
    config = "configs/study/long_range.yaml"
    folders = {preset: EXPERIMENT.load(config, preset, {}).out for preset in (None, "quick", "grid", "paper-scale")}
    assert folders == {None: "outputs/study/long_range", "quick": "outputs/study/long_range_quick",
                       "grid": "outputs/study/long_range_grid", "paper-scale": "outputs/study/long_range_paper_scale"}
    assert EXPERIMENT.load(config, "quick", {"out": "elsewhere"}).out == "elsewhere"
    help_text = " ".join(EXPERIMENT.parser().format_help().split())
    assert all(f"long_range_{p}" in help_text for p in ("quick", "grid", "paper_scale"))


def _fake_result(variant, depth, window, ks=(1,)):
    buckets = ["2-15", "16-31", "32-63", "64-127", "128-255"]
    rf = depth * (window - 1)
    acc = {"full": lambda lo: 1.0, "swa": lambda lo: 1.0 if lo <= rf else 0.0}.get(variant, lambda lo: 0.9)
    return dict(task="passkey", variant=variant, depth=depth, window=window, seed=0, seq_len=256, receptive_field=rf,
                scores={k: {"acc": 0.9, "loss": 0.1, "buckets": {b: acc(int(b.split("-")[0])) for b in buckets}}
                        for k in ks})


@pytest.mark.parametrize("panels", [[(2, 16)], [(2, 16), (4, 32)]])
def test_study_figure_keeps_legend_and_receptive_field_label_off_the_curves(panels, tmp_path, monkeypatch):
    """The L·(w−1) label once sat under the curves and the legend over the SA+SWA line: the label now sits above
    each panel's plotting area and one legend below all panels, outside every axis."""
    from sa_lightning.eval import recall
    from sa_lightning.utils import atomic

    figures = []
    real_savefig = atomic.savefig  # every figure is written through it (utils.report.save_figure)
    monkeypatch.setattr(atomic, "savefig",
                        lambda fig, path, **kw: (figures.append(fig), real_savefig(fig, path, **kw)))
    results = [_fake_result(v, d, w, (1, 16) if v in ("sa", "sa_swa") else (1,))
               for d, w in panels for v in ("full", "swa", "sa", "sa_swa")]
    recall.plot(results, tmp_path / "fig.png")
    assert (tmp_path / "fig.png").stat().st_size > 1000
    (fig,) = figures
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(fig)  # the closed figure's canvas draws nothing
    canvas.draw()
    renderer = canvas.get_renderer()
    axes = fig.axes
    assert len(axes) == len(panels) and all(ax.get_legend() is None for ax in axes)
    (legend,) = fig.legends
    labels = [t.get_text() for t in legend.get_texts()]
    assert labels.count("SA+SWA") == 1 and "SA+SWA (K=16)" in labels and "Full" in labels
    box = legend.get_window_extent(renderer)
    for ax, (depth, window) in zip(axes, panels):
        area = ax.get_window_extent(renderer)
        assert box.y1 < area.y0  # below the axes, over no curve
        (label,) = [t for t in ax.texts if t.get_text() == f"SWA's field L·(w−1)={depth * (window - 1)}"]
        assert label.get_window_extent(renderer).y0 >= area.y1  # above the plotting area
        assert ax.title.get_window_extent(renderer).y0 >= label.get_window_extent(renderer).y1 - 1  # not on the title


def test_a_cell_passes_its_fit_arguments_as_the_command_line(tmp_path, monkeypatch):
    """The study calls ``lit.cli.run(args)`` while ``sys.argv`` holds the study's own command: LightningCLI warned
    once per cell that both were given. The arguments now stand for the command line while the CLI runs."""
    import sys
    import warnings

    from sa_lightning.lit.cli import run

    monkeypatch.chdir(ROOT)
    study_argv = ["cli.py", "study", "long-range", "--preset", "quick"]
    monkeypatch.setattr(sys, "argv", list(study_argv))
    args = ["--config", "configs/synthetic/passkey.yaml", "--model.arch.n_layer", "1",
            "--data.init_args.seq_len", "64", "--model.arch.max_seq_len", "64",
            "--trainer.default_root_dir", str(tmp_path)]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cli = run(args, run=False)
    assert not [w for w in caught if "args parameter" in str(w.message)], [str(w.message) for w in caught]
    assert cli.model.arch.n_layer == 1 and cli.datamodule.seq_len == 64
    assert sys.argv == study_argv  # restored
    with pytest.raises(ValueError, match="unrecognized arguments: --no_such_flag 1"):  # one sentence, no usage
        run(["--no_such_flag", "1"], run=False)
    assert sys.argv == study_argv  # restored after a refusal too
