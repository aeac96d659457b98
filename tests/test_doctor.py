"""``cli.py doctor --tiny``: every stage a lent GPU will run, at toy sizes on the CPU, down to the report."""
import json
import os

import pytest

from sa_lightning.attention import VARIANTS
from tests.helpers import run_cli, run_cli_here

STAGES = ["env", "tests", "table2", "train", "profile"]  # the default: one GPU sitting


@pytest.mark.slow  # each stage is a process of its own
def test_doctor_tiny_runs_every_stage_and_writes_the_report(tmp_path):
    out = tmp_path / "doctor"
    res = run_cli("doctor", "--tiny", "--out", str(out))
    assert res.returncode == 0, res.stderr[-3000:]
    for i, name in enumerate(STAGES, 1):
        assert f"[{i}/5] {name}: ok in " in res.stdout, res.stdout + (out / "report.md").read_text()
    report = json.loads((out / "report.json").read_text())
    assert list(report["stages"]) == STAGES and all(r["status"] == "ok" for r in report["stages"].values())
    text = (out / "report.md").read_text()
    assert "| sa | banded | bfloat16 |" in text and "paper A100" in text and "bucketed ÷ SWA" in text
    grid = report["stages"]["tests"]["data"]["exactness"]
    sparse = {name for name, v in VARIANTS.items() if v.sparse}  # every variant but full attention (SDPA)
    assert {r["variant"] for r in grid} == sparse and all(r["ok"] for r in grid)
    assert {r["variant"] for r in report["stages"]["table2"]["data"]["rows"]} == {
        "full", "swa", "sa", "sa_bucket", "sa_swa", "random"}
    assert {r["variant"] for r in report["stages"]["train"]["data"]["rows"]} == {
        "swa", "sa", "sa_bucket", "full", "sa_swa"}
    assert "One attention call, forward and backward" in text  # the profile of SA's parts
    assert not list((out / "stages").glob("*.partial.json"))  # each stage's whole record replaced its partial one


@pytest.mark.slow  # each stage is a process of its own
def test_the_stages_outside_the_sitting_run_and_one_past_its_budget_is_killed_keeping_the_rest(tmp_path):
    """``recompiles`` (named, outside the sitting) runs whole; ``prefill`` is killed at a budget too short for it,
    and the finished stage stays in the report."""
    out = tmp_path / "doctor"
    res = run_cli_here("doctor", "--tiny", "--out", str(out), "--stages", "recompiles", "prefill", "--budget",
                       "prefill=1")
    assert res.returncode == 1 and "doctor: 1 stage(s) not ok (prefill)" in res.stderr, res.stderr[-2000:]
    report = json.loads((out / "report.json").read_text())
    assert report["stages"]["recompiles"]["status"] == "ok" and report["stages"]["prefill"]["status"] == "timeout"
    assert report["stages"]["recompiles"]["data"]["recompiles"] == 0
    text = (out / "report.md").read_text()
    assert "unique graphs:" in text and "| prefill | timeout |" in text and (out / "stages" / "prefill.log").is_file()


def test_doctor_without_a_gpu_points_to_tiny_and_bad_budgets_are_one_line(tmp_path):
    res = run_cli_here("doctor", "--out", str(tmp_path))
    assert res.returncode != 0 and "pass --tiny to run the same stages at toy sizes on the CPU" in res.stderr
    res = run_cli_here("doctor", "--tiny", "--out", str(tmp_path), "--budget", "train=-1")
    assert res.returncode != 0 and "--budget takes STAGE=SECONDS" in res.stderr
    assert not list(tmp_path.iterdir())


def test_tiny_budgets_stretch_with_a_slow_or_busy_machine_and_stay_finite(monkeypatch):
    """A busy laptop passes doctor --tiny (measured: load 6 on 2 cores, x5.9, every stage ok) and a hung stage
    is still killed: the factor is at least 1 and at most 10."""
    from sa_lightning import doctor

    monkeypatch.setattr(os, "getloadavg", lambda: (0.1, 0.1, 0.1))
    monkeypatch.setattr(doctor, "WARMUP_REFERENCE_S", 1e3)  # a machine far faster than the reference: 1
    assert doctor.machine_slowdown() == 1.0
    monkeypatch.setattr(os, "getloadavg", lambda: (7.0, 7.0, 7.0))
    assert doctor.machine_slowdown() == pytest.approx(max(1.0, 7.0 / len(os.sched_getaffinity(0))))
    monkeypatch.setattr(doctor, "WARMUP_REFERENCE_S", 1e-9)  # far slower: capped
    assert doctor.machine_slowdown() == 10.0


def test_a_stage_cut_at_its_budget_keeps_the_rows_it_wrote(tmp_path):
    """Table 2 and the compiled step write their rows as each length or variant ends (``stages/<name>.partial.json``):
    a stage killed at its budget reports them beside the timeout (the H200's sitting kept 8k and 16k this way)."""
    from sa_lightning import doctor

    (tmp_path / "stages").mkdir()
    assert doctor.cut_record(tmp_path, "table2", 150)["summary"].startswith("killed after its budget of 150 s")
    doctor._partial(tmp_path, "table2", {"status": "ok", "summary": "| 8192 | 18.4 |", "data": {"rows": [1, 2]}})
    record = doctor.cut_record(tmp_path, "table2", 150)
    assert record["status"] == "timeout" and record["data"] == {"rows": [1, 2]}
    assert record["summary"].endswith("What it measured by then:\n\n| 8192 | 18.4 |")


@pytest.mark.slow
def test_the_ensembles_sitting_measures_seeds_a_minute_and_runs_the_deciding_preset(tmp_path, monkeypatch):
    """Issue 64's GPU command (``doctor --stages env seeds decide``), its two stages at toy sizes in this process:
    ``seeds`` times each alone against K as one ensemble, ``decide`` runs the GPU deciding preset in ensembles and
    reports its comparisons; the preset is decide-l4's question at 128 seeds per compared arm."""
    from sa_lightning import doctor
    from sa_lightning.experiments.long_range import EXPERIMENT

    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    gpu, cpu = (EXPERIMENT.load("configs/study/long_range.yaml", p, {}) for p in ("decide-l4-gpu", "decide-l4"))
    compared = {arm for c in gpu.comparisons for arm in (c["a"], c["b"])} - {"full", "swa"}
    assert all(sum(c["variant"] == v for c in EXPERIMENT.cells(gpu)) >= 128 for v in compared)
    assert gpu.ensemble >= 128 and gpu.out != cpu.out
    assert (gpu.comparisons, gpu.margins, gpu.variants, gpu.depths, gpu.windows) == \
        (cpu.comparisons, cpu.margins, cpu.variants, cpu.depths, cpu.windows)
    gpu_only = ("trainer.val_check_interval", "trainer.accelerator", "trainer.enable_checkpointing",
                "trainer.callbacks")
    assert {k: v for k, v in gpu.fit_overrides.items() if k not in gpu_only} == \
        {k: v for k, v in cpu.fit_overrides.items() if k != "trainer.val_check_interval"}
    assert sum(doctor.BUDGETS["gpu"][s] for s in ("env", "seeds", "decide")) <= 480  # one call of 8 minutes
    (tmp_path / "stages").mkdir()
    seeds = doctor.stage_seeds(tmp_path, tiny=True)
    assert [r["case"] for r in seeds["data"]["rows"]] == ["alone", "K = 1", "K = 2"] and "seeds a minute" in \
        seeds["summary"]
    decide = doctor.stage_decide(tmp_path, tiny=True)
    assert decide["data"]["cells"] == 4 and {(r["a"], r["b"]) for r in decide["data"]["comparisons"]} == \
        {("sa", "random")}
    (logp,) = [line for line in decide["summary"].splitlines() if line.startswith("| logp | sa | random | 2 |")]
    assert " range [" in logp  # two seeds: their range, no interval
    assert (tmp_path / "decide" / "compare.md").is_file()
    assert not list((tmp_path / "decide").rglob("*.ckpt"))  # the GPU preset writes no checkpoints (their saves)
