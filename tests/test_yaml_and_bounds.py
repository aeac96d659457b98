"""Issue 78's tracebacks and unclear lines, each one sentence naming the file, flag or key and the way out
(docs/bad_input.md, the rows of issue 78): one YAML loader for every experiment (``utils.yamlfile``), a sweep config's wrong
type, ``study reach``'s n and trials, ``bench attention``'s controls below their least window, ``analyze``'s bounds
and progress, and ``doctor --stages`` into a full sitting's folder."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers import run_cli_here

ROOT = Path(__file__).resolve().parents[1]
#: a flow sequence left open: PyYAML's 60-70 lines named no file ("in "<unicode string>", line 2, column 6")
BROKEN = "windows: [16, 32\nseeds: [0]\n"
SAID = ("line 2, column 6: expected ',' or ']', but got ':' (the flow sequence that starts at line 1, column 10); fix "
        "the YAML there and run again.")


def _line(res) -> str:
    """The one line a refused command ends in, with no traceback or usage text before it."""
    assert res.returncode != 0, res.stdout[-2000:] + res.stderr[-2000:]
    assert "Traceback" not in res.stderr and "usage:" not in res.stderr, res.stderr[-3000:]
    return res.stderr.strip().splitlines()[-1]


@pytest.fixture
def broken(tmp_path) -> Path:
    path = tmp_path / "broken.yaml"
    path.write_text(BROKEN)
    return path


# ---- one YAML loader ---------------------------------------------------------------------------------
@pytest.mark.parametrize("command", [["study", "long-range"], ["study", "pretrain"], ["study", "reach"], ["sweep"],
                                     ["submit", "sweep", "--dry_run"], ["prepare"]])
def test_a_yaml_syntax_error_names_the_file_line_and_column(command, broken, tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    assert _line(run_cli_here(*command, "--config", str(broken))) == f"error: --config {broken}, {SAID}"
    if command[0] == "study":  # a --preset file, over the experiment's own config
        assert _line(run_cli_here(*command, "--preset", str(broken))) == f"error: --preset {broken}, {SAID}"


def test_a_fit_config_among_two_says_which_file_and_line(broken, monkeypatch):
    monkeypatch.chdir(ROOT)
    line = _line(run_cli_here("fit", "--config", "configs/tiny.yaml", "--config", str(broken)))
    assert line == f"error: --config {broken}, {SAID}"
    line = _line(run_cli_here("fit", "--config", "configs/tiny.yaml", "--model", str(broken)))  # a section's file
    assert line == f"error: --model {broken}, {SAID}"


def test_every_reader_of_yaml_goes_through_the_one_loader(broken, monkeypatch):
    """From Python too (a study's ``main(argv)``, the sweep's ``parse``, ``lit.cli.run``, a study's fit config
    checked before its first cell), and no module of the package reads YAML another way."""
    import re

    from sa_lightning.experiments import long_range, reach, sweep
    from sa_lightning.lit.cli import run

    monkeypatch.chdir(ROOT)
    for call in (lambda: reach.main(["--config", str(broken)]), lambda: sweep.EXPERIMENT.parse(["--config", str(broken)]),
                 lambda: run(["fit", "--config", str(broken)], run=False)):
        with pytest.raises(ValueError) as err:
            call()
        assert str(err.value) == f"--config {broken}, {SAID}"
    lr = long_range.EXPERIMENT
    with pytest.raises(ValueError) as err:
        lr.load(lr.config_file, "quick", {"fit_config": str(broken)})
    assert str(err.value) == f"the fit config {broken}, {SAID}"
    # a file read by PyYAML elsewhere (``yaml.safe_load(Path(p).read_text())``, ``yaml.safe_load(fh)``); parsing a
    # flow value given on a command line (``yaml.safe_load(text)``) reads no file
    readers = [str(p.relative_to(ROOT)) for p in (ROOT / "sa_lightning").rglob("*.py")
               if re.search(r"yaml\.(safe_)?load\((?!text\))", p.read_text()) and p.name != "yamlfile.py"]
    assert readers == [], readers


def test_a_config_that_is_not_a_mapping_is_named(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    listed = tmp_path / "list.yaml"
    listed.write_text("- 16\n- 32\n")
    assert _line(run_cli_here("study", "reach", "--config", str(listed))) == (
        f"error: --config {listed}: a config is a mapping of fields (name: value), but this file holds a list; write "
        "it as `field: value` lines.")


# ---- a sweep config's wrong type ------------------------------------------------------------------
def test_a_sweep_configs_wrong_type_names_the_key_and_where_it_was_set(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    config = tmp_path / "sweep.yaml"
    config.write_text("model: runs/none\nlimit: four\nwindows: [8]\npresets:\n  q: {windows: [a]}\n")
    said = f"error: limit: expected float, got four (set in --config {config})."
    assert _line(run_cli_here("sweep", "--config", str(config))) == said
    assert _line(run_cli_here("submit", "sweep", "--dry_run", "--config", str(config))) == said
    # the file's value is read before a later flag would override it: named as the file's, not the flag's
    assert _line(run_cli_here("sweep", "--config", str(config), "--limit", "5")) == said
    config.write_text("model: runs/none\nwindows: [8]\npresets:\n  q: {windows: [a]}\n")
    assert _line(run_cli_here("sweep", "--config", str(config), "--preset", "q")) == \
        "error: windows: expected int, got a (set in --preset q)."
    assert _line(run_cli_here("sweep", "--config", "configs/sweep/tiny.yaml", "--limit", "x")) == \
        "error: limit: expected float, got x (set in the command line (--limit))."
    assert _line(run_cli_here("sweep", "--config", "configs/sweep/tiny.yaml", "--nope", "3")) == \
        "cli.py sweep: error: unrecognized arguments: --nope 3 (cli.py sweep --help lists every option)"
    assert _line(run_cli_here("sweep")) == "error: sweep needs model: set it in --config or as --model."
    # a sweep's limit means what an evaluation's does: whole documents, or a share of each task below 1
    assert _line(run_cli_here("sweep", "--config", "configs/sweep/tiny.yaml", "--limit", "2.5")) == \
        "error: sweep limit must be a whole number of documents (>= 1) or a fraction of each task in (0, 1), got 2.5."


# ---- study reach's n, trials and size ---------------------------------------------------------------
@pytest.mark.parametrize("setting, said", [
    ("n: 0", "n must be an integer >= 2 (the row's tokens), got 0; nothing was run."),
    ("n: 20", "n: 20 leaves no key–query distance past SWA's field L·(w−1) = 30 at depth 2 and window 16 (the row's "
              "farthest distance is n − 1 = 19), and reach is measured past it: n must be at least L·(w−1) + 2 = 32 "
              "for every depth and window; raise n or lower the depths or windows. Nothing was run."),
    ("trials: 0", "trials must be an integer >= 1 (draws of every layer per seed), got 0; nothing was run."),
    ("depths: [0]", "depths must be integers >= 1 (layers stacked), got [0]; nothing was run."),
    ("windows: [2]", "strided needs a window >= 3 (it reads SA's 2*ceil(w/2) - 2 other keys), got 2."),
    ("n: 100000000", "study reach at n = 100000000 holds 100,000,000 × 100,000,000 masks, about "),
    ("trials: 100000000", "study reach at n = 256 draws 200,000,004 layers of 256 × 256 masks: about "),
])
def test_study_reach_refuses_a_row_without_distances_past_the_field_and_absurd_sizes(setting, said, tmp_path):
    key = setting.split(":")[0]
    lines = {"variants": "[sa, swa, strided]", "depths": "[2]", "windows": "[16]", "seeds": "[0]", "n": "256",
             "trials": "4", key: setting.split(": ")[1]}
    config = tmp_path / "reach.yaml"
    config.write_text("".join(f"{k}: {v}\n" for k, v in lines.items()) + f"out: {tmp_path / 'out'}\n")
    line = _line(run_cli_here("study", "reach", "--config", str(config)))
    assert line.startswith(f"error: {said}"), line
    assert not (tmp_path / "out").exists()  # refused before the folder, let alone a cell


# ---- bench attention's controls below their least window ------------------------------------------
def test_bench_attention_refuses_a_control_below_its_least_window_before_any_length(tmp_path):
    line = _line(run_cli_here("bench", "attention", "--variants", "swa", "strided", "--window", "2", "--lengths",
                              "64", "--out", str(tmp_path / "bench")))
    assert line == ("error: --variants strided needs --window >= 3 (it reads SA's 2*ceil(w/2) - 2 other keys), got "
                    "--window 2; raise --window or leave strided out of --variants.")
    assert not (tmp_path / "bench").exists()


# ---- analyze's bounds, its line past the field, its progress -----------------------------------
def test_analyze_refuses_absurd_sizes_up_front(tmp_path):
    line = _line(run_cli_here("analyze", "reach", "--layers", "100000", "--out", str(tmp_path / "a")))
    assert line.startswith("error: analyze reach at --n 2048 draws 3,300,000 layers of 2,048 × 2,048 masks: "
                           "about "), line
    assert line.endswith("and work estimated past 24 hours is refused up front (and at --layers 100000 SWA's field "
                         "L·(w−1) = 3,100,000 already passes the row's farthest distance, 2,047: no distance lies past "
                         "it); lower --n, --layers or --trials, or name fewer --variants."), line
    line = _line(run_cli_here("analyze", "coverage", "--n", "1000000", "--out", str(tmp_path / "a")))
    assert line.startswith("error: analyze coverage at --n 1000000 holds 1,000,000 × 1,000,000 masks, about "
                           "22,351.7 GiB, more than 60% of this machine's free memory ("), line
    assert line.endswith("); lower --n."), line
    assert not (tmp_path / "a").exists()


def test_analyze_reach_says_when_no_distance_lies_past_the_field_and_prints_progress(tmp_path, monkeypatch):
    from sa_lightning.analysis import analyze

    monkeypatch.setattr(analyze, "PROGRESS_EVERY", 0.05)  # 30 s in use
    res = run_cli_here("analyze", "reach", "--n", "16", "--window", "8", "--layers", "4", "--variants", "swa", "sa",
                       "--trials", "1", "--out", str(tmp_path))
    assert res.returncode == 0, res.stderr[-3000:]
    assert "reach            swa: no distance past SWA's field (28) in a row of 16 tokens (the farthest is 15); --n " \
           "above 29 measures reach past it" in res.stdout, res.stdout
    assert "nan" not in res.stdout
    assert "analyze reach: still at work, 0 s" in res.stdout, res.stdout
    res = run_cli_here("analyze", "reach", "--n", "64", "--window", "8", "--layers", "2", "--variants", "swa",
                       "--trials", "1", "--out", str(tmp_path))
    assert "reach            swa: 0.0% of the distances past SWA's field (14) reached in 2 layers" in res.stdout


def test_the_heartbeat_prints_at_least_every_interval_and_stops_with_its_block(capsys):
    import time

    from sa_lightning.utils.progress import Heartbeat

    with Heartbeat("work", every=0.05):
        time.sleep(0.3)
    said = capsys.readouterr().out.splitlines()
    assert 3 <= len(said) <= 6 and all(line.startswith("work: still at work, ") for line in said), said
    time.sleep(0.15)
    assert capsys.readouterr().out == ""  # nothing after the block
    with Heartbeat("quick", every=30):
        pass
    assert capsys.readouterr().out == ""


# ---- doctor --stages into a full sitting's folder -------------------------------------------------
def test_doctor_into_a_full_sittings_folder_says_which_stages_its_report_leaves_out(tmp_path, monkeypatch):
    from sa_lightning import doctor

    out = tmp_path / "sitting"
    (out / "stages").mkdir(parents=True)
    earlier = {"date": "2026-12-01", "stages": {name: {"status": "ok"} for name in ("env", "tests", "table2")}}
    doctor.write_report(out, ["env", "tests", "table2"], 1.0)  # a sitting's report, by the doctor itself
    (out / "report.json").write_text(json.dumps(earlier))  # (its contents as a full sitting leaves them)

    def ran(name, out, tiny, budget):
        record = {"status": "ok", "seconds": 1.0, "budget_s": budget, "summary": "fine"}
        (out / "stages" / f"{name}.json").write_text(json.dumps(record))
        return record

    monkeypatch.setattr(doctor, "_run_child", ran)
    res = run_cli_here("doctor", "--tiny", "--stages", "env", "--out", str(out))
    assert res.returncode == 0, res.stderr[-3000:]
    said = (f"{out / 'report.md'} held the stage(s) tests, table2 of an earlier run (2026-12-01); this run's report "
            f"covers env and replaces it, so those are not in it (their records stay in {out / 'stages'}; pass "
            "another --out to keep both reports).")
    assert f"note: {said}" in res.stdout, res.stdout
    assert f"Note: {said}" in (out / "report.md").read_text()
    assert json.loads((out / "report.json").read_text())["note"] == said
    res = run_cli_here("doctor", "--tiny", "--stages", "env", "--out", str(out))  # its own report now: no note
    assert "note: " not in res.stdout and "Note: " not in (out / "report.md").read_text()
