"""The experiments' cell loop: cells trained ``jobs`` at a time in worker processes, each written as it finishes."""
import json
import os
from pathlib import Path

import pytest

from sa_lightning.experiments import base, training
from sa_lightning.utils import runner


def _cell_id(cell: dict) -> str:
    return f"c{cell['n']}"


def _run(cell: dict, spec: dict) -> dict:
    """A stand-in for a study's ``run_cell``, at module level as the worker processes need."""
    import torch

    if cell["n"] == spec.get("fail"):
        raise ValueError(f"cell {cell['n']} failed")
    return {**cell, "pid": os.getpid(), "threads": torch.get_num_threads(), "seconds": 0.0,
            "scores": {"x": [cell["n"]]}}


def test_jobs_takes_a_count_or_auto_and_plans_threads_from_the_cores(monkeypatch):
    assert runner.jobs_arg("auto") == "auto" and runner.jobs_arg("3") == 3 and runner.jobs_arg(2) == 2
    for bad in ("0", "-1", "two"):
        with pytest.raises(Exception, match="count >= 1 or 'auto'"):
            runner.jobs_arg(bad)
    monkeypatch.setattr(runner, "cores_available", lambda: 8)
    assert runner.plan_jobs(2, 10) == (2, 4)
    assert runner.plan_jobs(4, 3) == (3, 2)          # never more processes than cells to train
    assert runner.plan_jobs(1, 10) == (1, 8)
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert runner.plan_jobs("auto", 24) == (8, 1)   # a CPU machine: one cell per core, one thread each
    assert runner.plan_jobs(None, 24) == (8, 1)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert runner.plan_jobs("auto", 24) == (1, 8)   # a GPU: the cells would share it


def test_a_bad_jobs_value_in_a_config_is_refused_before_anything_trains(tmp_path):
    from sa_lightning.experiments.pretrain import EXPERIMENT

    config = tmp_path / "study.yaml"
    config.write_text("models: [full]\nseeds: [0]\njobs: many\n")
    with pytest.raises(ValueError, match="jobs takes a count >= 1 or 'auto', got 'many'"):
        base.load_config(EXPERIMENT, config, None, {})


@pytest.mark.slow
def test_two_jobs_run_the_cells_in_two_worker_processes_in_grid_order(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(runner, "cores_available", lambda: 2)
    cells = [{"n": n} for n in range(1, 5)]
    out = tmp_path / "study"
    results = runner.run_cells(cells, out, _cell_id, lambda cell: {"v": 1}, _run,
                               line=lambda r: f"x={r['scores']['x'][0]}", jobs=2)
    assert [r["n"] for r in results] == [1, 2, 3, 4]
    assert os.getpid() not in {r["pid"] for r in results} and {r["threads"] for r in results} == {1}
    printed = capsys.readouterr().out
    assert "4 cells, 0 already done, 4 to run, 2 at a time (1 thread(s) each)" in printed
    assert all(f"/4] c{n}: x={n} (0 s;" in printed for n in range(1, 5))
    assert json.loads((out / "cells" / "c3.json").read_text())["spec"] == {"v": 1}
    again = runner.run_cells(cells, out, _cell_id, lambda cell: {"v": 1}, _run, line=lambda r: "", jobs=2)
    assert [r["pid"] for r in again] == [r["pid"] for r in results]  # read back, none trained again
    assert capsys.readouterr().out.count("done before") == 4


@pytest.mark.slow
def test_a_failed_cell_stops_the_study_and_keeps_the_cells_that_finished(tmp_path, monkeypatch):
    monkeypatch.setattr(runner, "cores_available", lambda: 2)
    cells = [{"n": n} for n in range(1, 4)]
    with pytest.raises(ValueError, match="cell 1 failed"):
        runner.run_cells(cells, tmp_path, _cell_id, lambda cell: {"fail": 1}, _run, line=lambda r: "", jobs=2)
    # the cells already handed to a worker finish and are kept whole; the failed one is not written
    assert not (tmp_path / "cells" / "c1.json").exists()
    for path in (tmp_path / "cells").glob("*.json"):
        assert json.loads(path.read_text())["spec"] == {"fail": 1}


def test_a_cell_trained_with_the_same_fit_arguments_is_scored_again_from_its_last_checkpoint(tmp_path, capsys):
    """A spec that changed only in its scoring (more σ seeds, say) reuses the trained model; one whose fit
    arguments changed, or whose checkpoint is gone or at another step, trains again."""
    import torch

    folder = tmp_path / "runs" / "c1"
    args = ["fit", "--config", "x.yaml", "--trainer.default_root_dir", str(folder)]
    saved = {"spec": {"fit_args": args, "eval_seeds": [0]}, "steps": 4, "train_seconds": 12.5, "scores": {}}
    spec = {"fit_args": args, "eval_seeds": [0, 1]}
    assert training.trained_checkpoint(saved, spec) is None  # no checkpoint
    ckpt = folder / "tb" / "version_0" / "checkpoints" / "last.ckpt"
    ckpt.parent.mkdir(parents=True)
    torch.save({"global_step": 4}, ckpt)
    assert training.trained_checkpoint(saved, spec) == {"checkpoint": str(ckpt), "steps": 4, "train_seconds": 12.5}
    assert training.trained_checkpoint({**saved, "steps": 5}, spec) is None  # another step: not the recorded model
    other = {**spec, "fit_args": args + ["--trainer.max_steps", "8"]}
    assert training.trained_checkpoint(saved, other) is None  # trained another way
    assert training.trained_checkpoint({}, spec) is None
    # trained under other kernel routes (another rounding): trained again, never scored as if made this way
    routed = {**spec, "kernels": training.KERNEL_ROUTES}
    assert training.trained_checkpoint(saved, routed) is None
    assert training.trained_checkpoint({**saved, "spec": {**saved["spec"], "kernels": training.KERNEL_ROUTES}},
                                       routed)["steps"] == 4
    # the study folder moved: the record made there stands, and the checkpoint is the one in this run's folder
    moved = ["fit", "--config", "x.yaml", "--trainer.default_root_dir", str(tmp_path / "elsewhere" / "runs" / "c1")]
    kept = {**saved, "spec": {**saved["spec"], "fit_args": moved}}
    assert training.trained_checkpoint(kept, spec) == {"checkpoint": str(ckpt), "steps": 4, "train_seconds": 12.5}
    ckpt.write_bytes(b"cut short")
    assert training.trained_checkpoint(saved, spec) is None  # damaged: train again

    # in the loop: the stand-in sees the checkpoint in the spec it is given; the record keeps the study's spec
    torch.save({"global_step": 4}, ckpt)
    (tmp_path / "cells").mkdir()
    (tmp_path / "cells" / "c1.json").write_text(json.dumps(saved))
    (result,) = runner.run_cells([{"n": 1}], tmp_path, _cell_id, lambda cell: spec, _run_seeing_spec,
                                 line=lambda r: "", jobs=1, given=_Stub().given)
    assert result["given"]["trained"]["checkpoint"] == str(ckpt)
    assert json.loads((tmp_path / "cells" / "c1.json").read_text())["spec"] == spec
    assert "c1: trained before with the same fit arguments; scored again" in capsys.readouterr().out


def _run_seeing_spec(cell: dict, spec: dict) -> dict:
    return {**cell, "given": spec, "seconds": 0.0, "scores": {}}


class _Stub(training.TrainedExperiment):
    cell_id = staticmethod(_cell_id)


def test_help_lists_the_presets_the_default_config_defines(tmp_path):
    """The presets in --help come from the config itself, so a new preset never goes missing from it."""
    import yaml

    from sa_lightning.experiments import long_range, pretrain

    for experiment in (long_range.EXPERIMENT, pretrain.EXPERIMENT):
        names = list(yaml.safe_load(open(experiment.config_file))["presets"])
        assert base.preset_names(experiment.config_file) == names and "quick" in names
        text = " ".join(experiment.parser().format_help().split())
        assert all(name in text.replace("- ", "-") for name in names)
    assert base.preset_names(str(tmp_path / "missing.yaml")) == []


def test_a_cells_spec_fingerprints_the_bytes_of_every_file_its_arguments_name(tmp_path):
    """A file named by a fit argument (``--set model.init_weights=FILE``) replaced by other bytes at the same path:
    the cell's inputs differ, so it is trained again rather than reused."""
    from sa_lightning.experiments.training import config_fingerprint

    config, weights = tmp_path / "fit.yaml", tmp_path / "w.ckpt"
    config.write_text("a: 1\n")
    weights.write_bytes(b"first")
    alone = config_fingerprint(["fit", "--config", str(config), "--trainer.max_steps", "3"])
    assert alone is not None and ";" not in alone  # the config alone: its fingerprint as before
    line = ["fit", "--config", str(config), f"--model.init_weights={weights}"]
    before = config_fingerprint(line)
    assert config_fingerprint(["fit", "--config", str(config), "--model.init_weights", str(weights)]) == before
    weights.write_bytes(b"other")
    assert config_fingerprint(line) != before


def test_a_quiet_cell_says_where_it_is_at_least_every_30_seconds(capsys, monkeypatch):
    from types import SimpleNamespace

    from sa_lightning.lit import callbacks

    clock = iter([0.0, 10.0, 31.0, 40.0, 62.0])
    monkeypatch.setattr(callbacks.time, "perf_counter", lambda: next(clock))
    beat = callbacks.Heartbeat("passkey_sa_L4_w16_s0")
    trainer = SimpleNamespace(global_step=0, max_steps=600, is_global_zero=True)
    beat.on_train_start(trainer, None)
    for step in (10, 31, 40):
        trainer.global_step = step
        beat.on_train_batch_end(trainer, None, None, None, 0)
    beat.on_validation_batch_end(trainer, None, None, None, 0)
    lines = capsys.readouterr().out.splitlines()
    assert lines == ["passkey_sa_L4_w16_s0: training at step 31 of 600, 31 s",
                     "passkey_sa_L4_w16_s0: validating at step 40 of 600, 62 s"]


def test_both_studies_take_their_grid_seeds_and_fit_checks_from_one_shared_home(tmp_path, monkeypatch):
    """The grid, the seeds by arm, the order of the cells and each cell's fit check are ``TrainedExperiment``'s: the
    cells run seed by seed (a run stopped part-way holds whole seeds, which pair), a fit config that is not a file and
    a window below a control's least are refused before any cell trains, in both studies."""
    from sa_lightning.experiments import long_range, pretrain
    from tests.helpers import ROOT

    monkeypatch.chdir(ROOT)
    cfg = pretrain.EXPERIMENT.load(pretrain.EXPERIMENT.config_file, None, {"models": ["full", "sa@32"],
                                                                           "seeds": [0, 1]})
    assert [(c["model"], c["seed"]) for c in pretrain.EXPERIMENT.cells(cfg)] == [
        ("full", 0), ("sa@32", 0), ("full", 1), ("sa@32", 1)]
    lr = long_range.EXPERIMENT
    cfg = lr.load(lr.config_file, "quick", {"variants": ["full", "sa"], "seeds": [0, 1], "depths": [2],
                                            "windows": [8], "tasks": ["passkey"], "seeds_by_variant": {"full": [0]}})
    assert [(c["variant"], c["seed"]) for c in lr.cells(cfg)] == [("full", 0), ("sa", 0), ("sa", 1)]
    assert lr.fit_swaps(lr.cells(cfg)[1], cfg) == ("configs/synthetic/passkey.yaml", {
        "model.arch.attention.variant": "sa", "model.arch.n_layer": 2, "model.arch.attention.window": 8,
        "seed_everything": 0})
    for experiment, overrides in ((pretrain.EXPERIMENT, {"models": ["full"], "seeds": [0]}),
                                  (lr, {"tasks": ["passkey"], "variants": ["sa"], "seeds": [0]})):
        with pytest.raises(ValueError, match=r"the fit config '.*nowhere.yaml' is not a file; nothing was trained"):
            experiment.load(experiment.config_file, "quick",
                            {**overrides, "fit_config": str(tmp_path / "nowhere.yaml")})
    with pytest.raises(ValueError, match="random needs a window >= 3"):
        pretrain.EXPERIMENT.load(pretrain.EXPERIMENT.config_file, None, {"models": ["random@2"], "seeds": [0]})
    with pytest.raises(ValueError, match="random needs a window >= 3"):
        lr.load(lr.config_file, "quick", {"variants": ["random"], "windows": [2], "seeds": [0]})
    with pytest.raises(ValueError, match="random needs a window >= 3"):  # an arm without seeds is checked too
        lr.load(lr.config_file, "quick", {"variants": ["random", "full"], "windows": [2], "seeds": [0],
                                          "seeds_by_variant": {"random": []}})
    with pytest.raises(ValueError, match="random needs a window >= 3"):  # and a comparison's arm the run leaves out
        pretrain.EXPERIMENT.load(pretrain.EXPERIMENT.config_file, None, {
            "models": ["full"], "seeds": [0], "comparisons": [{"a": "random@2", "b": "full"}]})
    with pytest.raises(ValueError, match="windows must be integers >= 1"):  # the grid's own check before any fit's
        lr.load(lr.config_file, "quick", {"windows": [0], "fit_config": str(tmp_path / "nowhere.yaml")})


def test_a_run_with_margins_says_before_its_first_cell_where_swa_trains_fewer_seeds_than_a_comparison_pairs(
        tmp_path, monkeypatch):
    """The floor rule ("equivalent" needs both arms to beat SWA by more than δ) is judged over the seeds SWA and the
    arms share. Table 12c's preset trained SWA on 5 of 20 seeds, too few to clear the margin; the header says so
    before the first cell, and says nothing where SWA trains every paired seed or no margin is set."""
    from sa_lightning.experiments import long_range, pretrain
    from tests.helpers import ROOT

    monkeypatch.chdir(ROOT)
    lr = long_range.EXPERIMENT
    cfg = lr.load(lr.config_file, "mqar-decide", {})
    header = lr.header(cfg, "mqar-decide", tmp_path, lr.cells(cfg))
    assert header.splitlines()[0].endswith(f"50 cell(s), results in {tmp_path}/")
    assert "note: the floor rule is judged over the seeds SWA trains" in header
    assert "sa_swa − random_swa (5 of its 20 seeds)" in header
    assert "full − swa" not in header and "sa_swa − swa" not in header  # rows against the floor are their own
    every = lr.load(lr.config_file, "mqar-decide", {"seeds_by_variant": {"full": [20, 21, 22, 23, 24]}})
    assert lr.floor_note(every) is None and "note:" not in lr.header(every, None, tmp_path, [])
    assert lr.floor_note(lr.load(lr.config_file, "mqar-decide", {"margins": {}})) is None
    no_swa = lr.load(lr.config_file, "mqar-decide", {"variants": ["sa_swa", "random_swa"], "seeds_by_variant": {}})
    # no floor trained (issue 78): said before the first cell, naming the floor and the way to decide
    assert lr.floor_note(no_swa) == (
        "margins are set, but the floor (swa) is not trained in this run, so sa_swa − random_swa cannot be called "
        "equivalent: \"equivalent\" needs both arms to beat the floor by more than the margin, and the report will say "
        "\"cannot decide\" for want of it; add swa to the run's variants to decide.")
    assert "\nnote: margins are set, but the floor (swa)" in lr.header(no_swa, None, tmp_path, [])
    for bad in (float("inf"), float("nan"), 0, -1):  # .inf made every comparison "equivalent"
        with pytest.raises(ValueError, match=r"to a finite equivalence margin > 0 in its unit, got logp: "):
            lr.load(lr.config_file, "mqar-decide", {"margins": {"logp": bad}})
    pre = pretrain.EXPERIMENT  # no seeds by arm there: SWA trains every seed the arms pair
    cfg = pre.load(pre.config_file, None, {"models": ["full", "swa@16", "sa@16", "random@16"], "seeds": [0, 1],
                                           "comparisons": [{"a": "sa@16", "b": "random@16"}],
                                           "margins": {"repeat_nll": 0.1}})
    assert pre.floor_note(cfg) is None


def test_a_trained_cells_spec_names_the_kernel_routes(tmp_path):
    """A trained cell's spec names ``KERNEL_ROUTES``, so a record made under other routes (another rounding) is not
    reused: its spec differs."""
    from sa_lightning.experiments.long_range import EXPERIMENT

    cfg = EXPERIMENT.load("configs/study/long_range.yaml", "quick")
    cell = EXPERIMENT.cells(cfg)[0]
    spec = EXPERIMENT.spec(cell, cfg, tmp_path)
    assert spec["kernels"] == training.KERNEL_ROUTES
    assert not EXPERIMENT.reuse({"spec": {k: v for k, v in spec.items() if k != "kernels"}}, spec)
    assert EXPERIMENT.reuse({"spec": spec}, spec)


@pytest.mark.parametrize("variant, revision", [("strided_local", 2), ("strided_local_swa", 2), ("radix", 2),
                                               ("sa", None), ("random", None)])
def test_a_trained_cells_spec_names_its_variants_revision_where_its_pattern_changed(variant, revision, tmp_path):
    """The deterministic controls' patterns follow the model's depth since revision 2 (issue 76): a cell of theirs
    trained before is trained again (its spec and its checkpoint's both refused); every other variant's spec is the
    one it had, so no cell of theirs trains again."""
    from pathlib import Path

    import torch

    from sa_lightning.experiments.long_range import EXPERIMENT

    cfg = EXPERIMENT.load("configs/study/long_range.yaml", "quick")
    cell = {**EXPERIMENT.cells(cfg)[0], "variant": variant}
    spec = EXPERIMENT.spec(cell, cfg, tmp_path)
    assert spec.get("revision") == revision
    before = {k: v for k, v in spec.items() if k != "revision"}
    assert EXPERIMENT.reuse({"spec": before}, spec) == (revision is None)
    folder = Path(spec["fit_args"][spec["fit_args"].index("--trainer.default_root_dir") + 1])
    ckpt = folder / "tb" / "version_0" / "checkpoints" / "last.ckpt"
    ckpt.parent.mkdir(parents=True)
    torch.save({"global_step": 4}, ckpt)
    found = training.trained_checkpoint({"spec": before, "steps": 4}, spec)
    assert (found is None) == (revision is not None)


def test_a_pre_registered_run_prints_the_commit_that_fixed_its_preset(tmp_path):
    """Its first lines say what was fixed and in which commit, so a reader can check that it came before the cells."""
    from sa_lightning.experiments import long_range

    exp = long_range.EXPERIMENT
    cfg = exp.load(exp.config_file, "decide-l4-strided", {})
    said = exp.header(cfg, "decide-l4-strided", tmp_path, [])
    assert "pre-registered: 2026-11-29, before its first cell" in said, said
    # a full clone names the commit; a shallow one (or a copy without .git) says it cannot
    assert "the preset was first committed in 4a54342" in said or "its commit cannot be shown" in said, said
    assert "pre-registered" not in exp.header(exp.load(exp.config_file, "quick", {}), "quick", tmp_path, [])


def test_a_new_outcome_scores_every_finished_cell_again_from_its_checkpoint(tmp_path):
    """A trained cell's spec names the outcomes its study scores (issue 77's trap): a study that adds one reuses no
    record made without it, and scores the cell again from its last checkpoint rather than train it."""
    import torch

    from sa_lightning.experiments import long_range

    exp = long_range.EXPERIMENT
    cfg = exp.load(exp.config_file, "quick", {})
    cell = exp.cells(cfg)[0]
    spec = exp.spec(cell, cfg, tmp_path)
    assert spec["outcomes"] == [o.key for o in long_range.OUTCOMES]
    before = {**spec, "outcomes": spec["outcomes"][:1]}  # a record scored before the second outcome existed
    saved = {"spec": before, "steps": 4, "train_seconds": 1.0}
    assert not exp.reuse(saved, spec)
    args = spec["fit_args"]
    ckpt = Path(args[args.index("--trainer.default_root_dir") + 1]) / "tb" / "version_0" / "checkpoints" / "last.ckpt"
    ckpt.parent.mkdir(parents=True)
    torch.save({"global_step": 4}, ckpt)
    assert exp.given(cell, saved, spec)["trained"]["steps"] == 4  # scored again, not trained
