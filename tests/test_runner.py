"""The one experiment runner (utils/runner.py): cells reused only when every input matches, damaged cells run
again, seeds counted once, one lock per output folder, and a signal that stops every worker and exits in one line."""
import gzip
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sa_lightning.utils import runner

ROOT = Path(__file__).resolve().parents[1]


def _id(cell):
    return f"c{cell}"


def _scored(cell, spec):
    """A cell that keeps per-item records, at module level for the worker processes."""
    return {"cell": cell, "seconds": 0.0, "scores": {"x": cell}, "items": [{"doc_id": i, "x": cell} for i in range(3)]}


def _slow(cell, spec):
    """A cell that runs until it is stopped, its pid written where the test can read it."""
    Path(spec["pids"], f"{os.getpid()}").write_text("")
    time.sleep(600)
    return {"cell": cell, "seconds": 0.0, "scores": {}}


def test_a_finished_cell_is_reused_and_a_damaged_one_runs_again(tmp_path, capsys):
    out = tmp_path / "run"
    first = runner.run_cells([1, 2], out, _id, lambda c: {"v": 1}, _scored, line=lambda r: "ok", needs="scores")
    # each record comes back with its per-item records, as a rerun reads them back (one parse of each file)
    assert [r["items"] for r in first] == [[{"doc_id": i, "x": c} for i in range(3)] for c in (1, 2)]
    assert [r["items_file"] for r in first] == [f"c{c}.items.jsonl.gz" for c in (1, 2)]
    assert len(runner.read_cell(out / "cells" / "c1.json")) > 0
    # items cut short by a kill before cells were written atomically: a traceback before, a rerun now
    items = out / "cells" / "c2.items.jsonl.gz"
    items.write_bytes(items.read_bytes()[:-12])
    capsys.readouterr()
    again = runner.run_cells([1, 2], out, _id, lambda c: {"v": 1}, _scored, line=lambda r: "ok", needs="scores")
    printed = capsys.readouterr().out
    assert "c2.json is damaged (cut short?); running that cell again" in printed
    assert "[1/2] c1: ok (done before" in printed and "[2/2] c2: ok (0 s" in printed
    assert len(runner.read_cell(out / "cells" / "c2.json")) > 0 and len(again[1]["items"]) == 3
    # a record cut short, and one whose items hold another count
    (out / "cells" / "c1.json").write_text('{"cell": 1, "sco')
    rec = json.loads((out / "cells" / "c2.json").read_text())
    (out / "cells" / "c2.json").write_text(json.dumps({**rec, "items": {**rec["items"], "count": 5}}))
    assert runner.read_cell(out / "cells" / "c1.json") == {} and runner.read_cell(out / "cells" / "c2.json") == {}
    # another spec: run again, not reported as done
    capsys.readouterr()
    runner.run_cells([1], out, _id, lambda c: {"v": 2}, _scored, line=lambda r: "ok")
    assert "done before" not in capsys.readouterr().out


def test_a_seed_named_twice_counts_once(capsys):
    assert runner.unique_seeds([0, 0, 0, 2, 1, 2], "--seeds") == [0, 2, 1]
    assert "--seeds: 0, 2 named more than once; each seed counts once (0, 2, 1)" in capsys.readouterr().err
    assert runner.unique_seeds([3, 4]) == [3, 4] and capsys.readouterr().err == ""


def test_a_fingerprint_follows_the_bytes_not_the_path(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "model.safetensors").write_bytes(b"a" * 1000)
    (model / "config.json").write_text("{}")
    before = runner.fingerprint(model)
    os.utime(model / "model.safetensors", (0, 0))
    assert runner.fingerprint(model) == before  # a touch is not new weights
    (model / "model.safetensors").write_bytes(b"b" * 1000)  # exported again in place, other weights
    assert runner.fingerprint(model) != before
    (model / ".lock").write_text("x")  # hidden files are not the model
    assert runner.fingerprint(model) == runner.fingerprint(model)
    assert runner.fingerprint(model / "config.json") != runner.fingerprint(model)


@pytest.mark.slow
def test_a_second_run_into_the_same_folder_is_refused(tmp_path):
    out = tmp_path / "sweep"
    code = ("import sys, time; from sa_lightning.utils import runner; runner.folder_lock(sys.argv[1], 'sweep'); "
            "print('locked', flush=True); time.sleep(60)")
    holder = subprocess.Popen([sys.executable, "-c", code, str(out)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(ValueError, match=r"is in use by pid \d+ .*another sweep writing there"):
            runner.folder_lock(out, "sweep")
    finally:
        holder.kill()
        holder.wait()
    runner.folder_lock(out, "sweep").release()  # the holder is gone: so is its lock


def _stop_run(out, pids, jobs=2):
    """The child of the signal test: two workers (or the runner itself, with one job) that would run for minutes."""
    runner.run_cells([1, 2, 3], Path(out), _id, lambda c: {"pids": pids}, _slow, line=lambda r: "ok", jobs=int(jobs),
                     given=lambda cell, saved, spec: {**spec})


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie is not running
        return f.read().split(")")[-1].split()[0] != "Z"


def _default_signals() -> None:
    """The child as a terminal would start it: a suite run under ``nohup`` (SIGHUP ignored) or as a background job
    (SIGINT ignored) passes that on, and the runner rightly leaves an ignored signal ignored."""
    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(s, signal.SIG_DFL)


@pytest.mark.parametrize("signum, jobs", [(signal.SIGTERM, 2), (signal.SIGINT, 2), (signal.SIGHUP, 1)])
@pytest.mark.slow
def test_a_signal_stops_every_worker_keeps_the_finished_cells_and_exits_in_one_line(tmp_path, signum, jobs):
    pids = tmp_path / "pids"
    pids.mkdir()
    code = "import sys; from tests.test_runner import _stop_run; _stop_run(*sys.argv[1:])"
    child = subprocess.Popen([sys.executable, "-c", code, str(tmp_path / "run"), str(pids), str(jobs)], cwd=ROOT,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=_default_signals)
    deadline = time.time() + 60
    while len(list(pids.iterdir())) < jobs and time.time() < deadline:
        time.sleep(0.1)
    workers = [int(p.name) for p in pids.iterdir()]
    assert len(workers) == jobs, child.communicate(timeout=5)
    child.send_signal(signum)
    _, err = child.communicate(timeout=30)
    assert child.returncode == 128 + signum
    assert err.strip().splitlines() == [f"stopped by {signal.Signals(signum).name}: 0 of 3 cell(s) finished and "
                                        f"kept in {tmp_path / 'run' / 'cells'}; run the same command again to go "
                                        "on from there"]
    time.sleep(0.5)
    assert not any(_alive(pid) for pid in workers)


def test_items_are_written_before_the_record_that_marks_a_cell_done(tmp_path):
    path = tmp_path / "cells" / "c1.json"
    record = runner.write_cell(path, {"scores": {}, "items": [{"a": 1}]})
    assert record["items"] == {"file": "c1.items.jsonl.gz", "count": 1}
    with gzip.open(tmp_path / "cells" / "c1.items.jsonl.gz", "rt") as f:
        assert json.loads(f.readline()) == {"a": 1}


def test_a_label_with_a_bar_or_a_newline_stays_one_table_cell():
    from sa_lightning.eval.evaluate import slug
    from sa_lightning.utils.report import row

    line = row(["SA | mine\nv2", 1.5])
    assert line == "| SA \\| mine v2 | 1.5 |" and line.count(" | ") == 1
    assert slug("SA | mine\nv2") == "SA_mine_v2" and slug("Full (w=32)") == "Full_w=32"


def test_a_ctrl_c_outside_a_cell_loop_is_one_line(tmp_path):
    code = ("import os, signal, sys; sys.argv = ['cli.py', 'x']; import sa_lightning.main as m; "
            "m.main = lambda: os.kill(os.getpid(), signal.SIGINT); m.main_with_clean_errors()")
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         preexec_fn=_default_signals)
    assert res.returncode == 130 and "Traceback" not in res.stderr
    assert res.stderr.strip() == "stopped by SIGINT (Ctrl-C); every file written so far is whole"


def test_a_preset_is_the_configs_own_or_a_second_yaml_file(tmp_path):
    presets = {"quick": {"seeds": [0]}}
    assert runner.preset_values(presets, "quick", "study.yaml") == {"seeds": [0]}
    second = tmp_path / "mine.yaml"
    second.write_text("seeds: [3, 4]\nlimit: 10\npresets: {x: {}}\n")
    assert runner.preset_values(presets, str(second), "study.yaml") == {"seeds": [3, 4], "limit": 10}
    with pytest.raises(ValueError, match=r"unknown preset 'fast'; study.yaml has quick \(or pass a YAML file"):
        runner.preset_values(presets, "fast", "study.yaml")
    with pytest.raises(ValueError, match=r"--preset gone.yaml: no such file .*study.yaml's presets: quick"):
        runner.preset_values(presets, "gone.yaml", "study.yaml")
    with pytest.raises(ValueError, match=r"preset '.*mine.yaml' sets unknown field\(s\) limit"):
        runner.preset_values(presets, str(second), "this config", known={"seeds"})


def test_a_sweep_and_a_study_take_a_second_yaml_as_their_preset(tmp_path):
    from sa_lightning.experiments import pretrain, sweep

    mine = tmp_path / "mine.yaml"
    mine.write_text("windows: [16]\nlimit: 3\n")
    cfg = sweep.EXPERIMENT.parse(["--config", "configs/sweep/tiny.yaml", "--preset", str(mine)])[0]
    assert cfg.windows == [16] and cfg.limit == 3
    mine.write_text("seeds: [5, 6]\nlimit: 7\n")
    settings = pretrain.EXPERIMENT.load("configs/study/pretrain.yaml", str(mine), {})
    assert settings.seeds == [5, 6] and settings.limit == 7


@pytest.mark.parametrize("study, text, said", [
    ("pretrain", "models: [full]\nseeds: [zero]\n", "seeds: expected int, got zero (set in --config "),
    ("pretrain", "models: [full]\nseeds: [0]\nlimt: 5\n", "sets unknown field(s) 'limt'; its fields are models, seeds"),
    ("long_range", "tasks: [passkey]\nvariants: sa\ndepths: [2]\nwindows: [16]\nseeds: [0]\n",
     "variants: expected list, got sa (set in --config "),
])
def test_a_study_config_of_the_wrong_type_is_one_sentence_naming_the_file_and_key(tmp_path, study, text, said):
    import importlib

    module = importlib.import_module(f"sa_lightning.experiments.{study}")
    config = tmp_path / "study.yaml"
    config.write_text(text)
    with pytest.raises(ValueError) as err:
        module.EXPERIMENT.load(config, None, {})
    assert str(config) in str(err.value) and said in str(err.value) and "\n" not in str(err.value)


def test_one_kind_of_run_never_reports_replaces_or_prunes_anothers_cells(tmp_path):
    from sa_lightning.utils import atomic

    out = tmp_path / "sweep"
    runner.run_cells([1], out, _id, lambda c: {"v": 1}, _scored, line=lambda r: "ok", kind="sweep")
    assert (out / "cells" / atomic.CELLS_KIND).read_text() == "sweep\n"
    with pytest.raises(ValueError, match="holds the cells of a sweep, not of a evaluation"):
        atomic.check_results_folder(out, "evaluation", overwrite=True)
    with pytest.raises(ValueError, match="holds the cells of a sweep, not of a study"):
        runner.run_cells([1], out, _id, lambda c: {"v": 1}, _scored, line=lambda r: "ok", kind="study")
    runner.prune_cells(out, [], "evaluation")  # not its cells: nothing removed
    assert (out / "cells" / "c1.json").is_file()
    # a run stopped before its first cell leaves only its lock: the folder is still its own to use
    fresh = tmp_path / "fresh"
    runner.folder_lock(fresh, "study").release()
    assert atomic.check_results_folder(fresh, "study") == fresh


def test_a_signal_the_process_ignores_stays_ignored():
    previous = signal.signal(signal.SIGHUP, signal.SIG_IGN)  # what nohup does
    try:
        with runner.stopping():
            assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
            assert signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, signal.SIG_IGN)
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGHUP, previous)


def test_too_few_seeds_leave_the_positive_control_unknown_and_pairs_must_match():
    import numpy as np

    from sa_lightning.utils import stats

    three = stats.seed_difference([(np.ones(4), np.zeros(4))] * 3)
    assert stats.headroom(three) is None and stats.headroom_label(stats.headroom(three)) == "–"
    with pytest.raises(ValueError, match="pairs seed by seed, got 5 seeds for A and 3 for B"):
        stats.difference(np.zeros((5, 4)), np.zeros((3, 4)), "seeds")


def test_a_preset_file_that_is_not_a_mapping_is_one_sentence(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("- seeds\n- limit\n")
    with pytest.raises(ValueError, match="must be a mapping of config fields, got list"):
        runner.preset_values({}, str(bad), "study.yaml")


def test_every_record_names_its_machine_and_a_cell_made_on_another_is_reused_and_said(tmp_path, capsys):
    """A single seed's value does not carry across CPUs, so each record names the machine that made it; a reuse of
    a cell made elsewhere is allowed (the statistics carry) and said in its line."""
    from sa_lightning.utils import host

    out = tmp_path / "run"
    runner.run_cells([1], out, _id, lambda c: {"v": 1}, _scored, line=lambda r: "ok")
    path = out / "cells" / "c1.json"
    record = json.loads(path.read_text())
    assert record["machine"]["cpu"] == host.cpu_name() and record["machine"]["torch"] and record["machine"]["threads"]
    capsys.readouterr()
    runner.run_cells([1], out, _id, lambda c: {"v": 1}, _scored, line=lambda r: "ok")
    assert "(done before;" in capsys.readouterr().out  # the same machine: nothing to say
    path.write_text(json.dumps({**record, "machine": {**record["machine"], "cpu": "Another CPU"}}))
    again = runner.run_cells([1], out, _id, lambda c: {"v": 1}, _scored, line=lambda r: "ok")
    assert again[0]["scores"] == {"x": 1}  # reused, not run again
    assert "done before on another machine: Another CPU" in capsys.readouterr().out


def test_a_seed_out_of_range_is_refused_before_any_cell():
    """``--seeds 99999999999`` failed 8 minutes in with Lightning's message (issue 66)."""
    with pytest.raises(ValueError, match=r"seeds: 99999999999 is not a seed; a seed is an integer from 0 to 2\*\*32 - 1"):
        runner.unique_seeds([0, 99999999999], "seeds")
    with pytest.raises(ValueError, match="-1 is not a seed"):
        runner.unique_seeds([-1], "sweep seeds")
    assert runner.unique_seeds([3, 3, 2**32 - 1], "seeds") == [3, 2**32 - 1]


def test_a_studys_fit_overrides_keep_their_values_as_written():
    """``fit_overrides`` holds fit arguments: a value naming a class_path (a callbacks list) stays as written, not a
    Namespace that prints as no fit argument, and the settings given are not changed in place."""
    import copy

    from sa_lightning.experiments.long_range import LongRangeConfig
    from sa_lightning.utils.runner import typed_settings

    callbacks = '[{"class_path": "sa_lightning.lit.DistanceAccuracy"}]'
    settings = {"tasks": ["passkey"], "variants": ["sa"], "depths": [2], "windows": [16], "seeds": [0],
                "fit_overrides": {"trainer.callbacks": callbacks, "data.repeats": {"length": 16, "gap": 160},
                                  "trainer.max_steps": 5}}
    given = copy.deepcopy(settings)
    kept = typed_settings(LongRangeConfig, settings, "study.yaml")
    assert kept["fit_overrides"] == given["fit_overrides"] and settings == given
    listed = {"trainer.callbacks": [{"class_path": "sa_lightning.lit.DistanceAccuracy"}]}
    as_list = {**settings, "fit_overrides": listed}
    assert typed_settings(LongRangeConfig, as_list, "study.yaml")["fit_overrides"] == as_list["fit_overrides"]
