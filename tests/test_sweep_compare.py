"""Statistics in the sweep (issue 35): every cell keeps per-item records that pair across cells, every table number
carries a 95% interval, and the compare step writes paired differences with verdicts and the ΔNLL against full."""
import gzip
from dataclasses import replace
import json

import numpy as np
import pytest

from sa_lightning.inference import compare
from sa_lightning.inference.plan import SweepConfig
from sa_lightning.utils.stats import BETTER, TIED, WORSE
from tests.test_sweep_reuse import two_models  # noqa: F401  (a fixture: the same tiny models)
from tests.helpers import check_result_contract

#: a task the config resolves at once (a shipped one): these tests hand the scores over themselves
T = "shakespeare_lastword"

VERDICTS = {BETTER, WORSE, TIED}


@pytest.fixture(scope="module")
def tiny_model(two_models):
    """A tiny random Qwen3 and the embedded tokenizer, saved as a Hugging Face folder (the reuse test's first)."""
    return two_models[0]


def _items(path):
    with gzip.open(path, "rt") as f:
        return [json.loads(line) for line in f]


def test_a_sweep_keeps_paired_items_puts_intervals_in_its_table_and_compares(tiny_model, tmp_path, capsys,
                                                                             monkeypatch):
    from sa_lightning.inference import sweep_report
    from sa_lightning.experiments.sweep import main

    monkeypatch.setattr(sweep_report, "figures", lambda *args: {})  # the figures have tests of their own
    out = tmp_path / "sweep"
    args = ["--model", str(tiny_model), "--dtype", "float32", "--device_map", "cpu",
            "--tasks", "[shakespeare_lastword, position_ppl_256]", "--modes", "[full, swa, sa]", "--windows", "[8]",
            "--seeds", "[0, 1]", "--limit", "6", "--task_limits", "{position_ppl_256: 3}",
            "--comparisons", "[{a: full, b: swa}, {a: sa, b: swa, match: equal_w}, {a: sa, b: swa, match: equal_keys}]",
            "--out", str(out)]
    result = main(args)
    cells = out / "cells"
    # per-item records beside each cell, keyed by doc id, the same documents in every cell of a task
    sa, swa = _items(cells / "sa_w8_s1_shakespeare_lastword.items.jsonl.gz"), \
        _items(cells / "swa_w8_s0_shakespeare_lastword.items.jsonl.gz")
    assert [r["doc_id"] for r in sa] == [r["doc_id"] for r in swa] == list(range(6))
    assert all(set(r["scores"]) >= {"acc"} and len(r["ll"]) == 1 for r in sa)
    record = json.loads((cells / "sa_w8_s1_shakespeare_lastword.json").read_text())
    assert record["items"] == {"file": "sa_w8_s1_shakespeare_lastword.items.jsonl.gz", "count": 6}
    assert record["metrics"]["acc"] == pytest.approx(np.mean([r["scores"]["acc"] for r in sa]))
    docs = _items(cells / "full_wall_s0_position_ppl_256.items.jsonl.gz")
    assert [d["doc_id"] for d in docs] == [0, 1, 2] and all(len(d["nll"]) == 255 for d in docs)
    ppl = json.loads((cells / "full_wall_s0_position_ppl_256.json").read_text())["metrics"]["ppl"]
    assert ppl == pytest.approx(float(np.exp(np.mean([d["nll"] for d in docs]))), rel=1e-4)

    # the table: every number with its interval, how they were made, and SA's seed spread on its own
    table = (out / "table.md").read_text()
    sa_row = next(line for line in table.splitlines() if line.startswith("| 8 | SA |"))
    assert sa_row.count("[") == 3, sa_row  # LW, PPL@256 and Avg.
    assert "each item counts as its mean over the seeds" in table and "Seed-to-seed spread" in table
    row = next(r for r in result["rows"] if (r["mode"], r["w_eff"]) == ("sa", 8))
    assert row["shakespeare_lastword:seeds"] == 2 and row["shakespeare_lastword:items"] == 6
    assert row["position_ppl_256:lo"] <= row["position_ppl_256"] <= row["position_ppl_256:hi"]
    assert "shakespeare_lastword:seed_sd" in (out / "results.csv").read_text().splitlines()[0]

    # compare.md / compare.json: one row per (comparison, window, task), verdicts from the interval
    rows = check_result_contract(out, "sweep")["comparisons"]
    assert {(r["a"], r["match"]) for r in rows} == {("full", "equal_w"), ("sa", "equal_w"), ("sa", "equal_keys")}
    equal_w = [r for r in rows if r["a"] == "sa" and r["match"] == "equal_w"]
    assert {(r["a_w_eff"], r["b_w_eff"], r["task"]) for r in equal_w} == {
        (8, 8, t) for t in ("shakespeare_lastword", "position_ppl_256")}
    for r in rows:
        assert r["verdict"] in VERDICTS and r["lo"] <= r["mean"] <= r["hi"]
        # 3 documents: 3 segments each where nothing draws σ; SA's 2 σ seeds x 3 documents: 6 (σ seed, document)
        # clusters, since one σ draw shifts a whole document
        assert r["items"] == (6 if r["task"] == "shakespeare_lastword" or r["a"] == "sa" else 9)
        assert (r["seeds"], r["seeds_b"]) == ((2, 1) if r["a"] == "sa" else (1, 1))
    assert all(r["a_kpq"] < r["b_kpq"] < 8 for r in rows if r["match"] == "equal_keys")  # keys/q, measured
    deltas = json.loads((out / "compare.json").read_text())["delta_nll"]
    assert {(d["mode"], d["w_eff"], d["documents"], d["seeds"]) for d in deltas} == {("swa", 8, 3, 1), ("sa", 8, 3, 2)}
    assert set(deltas[0]["buckets"]) == {"ppl@1-63", "ppl@64-127", "ppl@128-255", "all"}
    text = (out / "compare.md").read_text()
    assert "| SA | SWA | equal w | LW | 8 (" in text and "ΔNLL against full attention by position: PPL@256" in text

    # a cell without item records is left out of the statistics and named; --compare runs nothing
    (cells / "swa_w8_s0_shakespeare_lastword.items.jsonl.gz").unlink()
    capsys.readouterr()
    main([*args, "--compare"])
    assert "7 done, none run (--compare)" in capsys.readouterr().out
    text = (out / "compare.md").read_text()
    assert "1 cell(s)" in text and "swa_w8_s0_shakespeare_lastword" in text and "to run them" in text
    assert "| SA | SWA | equal w | LW |" not in text  # SWA's LW cell is out of the statistics
    assert not (cells / "swa_w8_s0_shakespeare_lastword.items.jsonl.gz").exists()
    # a plain rerun runs that cell again, and only it
    main(args)
    assert "1 to run (1 of them again" in capsys.readouterr().out
    assert (cells / "swa_w8_s0_shakespeare_lastword.items.jsonl.gz").exists()
    assert "no finished record" not in (out / "compare.md").read_text()
    # a record cut short is named, with the way out (once: "Expecting value: line 5 column 9", no file)
    whole = (cells / "sa_w8_s1_shakespeare_lastword.json").read_text()
    (cells / "sa_w8_s1_shakespeare_lastword.json").write_text(whole[:40])
    capsys.readouterr()
    main([*args, "--compare"])
    assert "sa_w8_s1_shakespeare_lastword.json is damaged (cut short?); left out (run the same command without " \
           "--compare" in capsys.readouterr().out
    assert "sa_w8_s1_shakespeare_lastword" in (out / "compare.md").read_text()


def _scores(kpq, seeds=1, n=20, shift=0.0):
    rng = np.random.default_rng(int(kpq * 10))
    return compare.TaskScores(list(range(n)), 100.0 * (rng.random((seeds, n)) < 0.5 + shift), list(range(seeds)),
                              kpq=kpq)


def test_each_match_pairs_the_settings_the_paper_compares():
    cfg = SweepConfig(model="m", tasks=[T], modes=["full", "swa", "sa"], windows=[4, 8, 16], comparisons=[
        {"a": "sa", "b": "swa", "match": "equal_w"}, {"a": "sa", "b": "swa", "match": "equal_keys"},
        {"a": "sa", "b": "swa", "match": "double_w"}, {"a": "full", "b": "swa"}])
    loaded = compare.Loaded({(("sa", 8, 0), T): _scores(4.0, seeds=3), (("swa", 4, 0), T): _scores(3.9),
                             (("swa", 8, 0), T): _scores(7.9), (("swa", 16, 0), T): _scores(15.5),
                             (("full", None, 0), T): _scores(50.0)}, [])
    pairs = [(r["match"], r["a_w_eff"], r["b_w_eff"]) for r in compare.comparison_rows(cfg, loaded)]
    assert pairs == [("equal_w", 8, 8), ("equal_keys", 8, 4), ("double_w", 8, 16),
                     ("equal_w", None, 4), ("equal_w", None, 8), ("equal_w", None, 16)]


def test_a_clear_difference_gets_its_verdict_and_a_tie_does_not():
    cfg = SweepConfig(model="m", tasks=[T], modes=["swa", "sa"], windows=[8],
                      comparisons=[{"a": "sa", "b": "swa", "match": "equal_w"}])
    ones, zeros = np.full((1, 50), 100.0), np.zeros((1, 50))
    ones[0, :5] = 0.0
    for a, b, want in ((ones, zeros, BETTER), (zeros, ones, WORSE), (zeros, zeros, TIED)):
        loaded = compare.Loaded({(("sa", 8, 0), T): compare.TaskScores(list(range(50)), a, [0], kpq=4.0),
                                 (("swa", 8, 0), T): compare.TaskScores(list(range(50)), b, [0], kpq=8.0)}, [])
        (row,) = compare.comparison_rows(cfg, loaded)
        assert row["verdict"] == want


def test_a_row_without_headroom_says_so_and_the_summary_counts_only_the_rows_with_it():
    """The positive control per row: where full attention does not beat SWA at B's window, task and sink, the row
    cannot rank long-range variants, and compare.md and the printed summary keep those rows apart."""
    cfg = SweepConfig(model="m", tasks=[T], modes=["full", "swa", "sa"], windows=[8, 16], comparisons=[
        {"a": "full", "b": "swa"}, {"a": "sa", "b": "swa", "match": "equal_w"}])
    ids, n = list(range(40)), 40
    right, wrong = np.full((1, n), 100.0), np.zeros((1, n))
    loaded = compare.Loaded({(("full", None, 0), T): compare.TaskScores(ids, right, [0], kpq=50.0),
                             (("swa", 8, 0), T): compare.TaskScores(ids, wrong, [0], kpq=8.0),  # full beats it
                             (("swa", 16, 0), T): compare.TaskScores(ids, right, [0], kpq=16.0),  # no headroom
                             (("sa", 8, 0), T): compare.TaskScores(ids, wrong, [0, 1], kpq=4.0),
                             (("sa", 16, 0), T): compare.TaskScores(ids, wrong.repeat(2, 0), [0, 1], kpq=8.0)}, [])
    rows = compare.comparison_rows(cfg, loaded)
    assert [(r["a"], r["b_w_eff"], r["headroom"]) for r in rows] == [
        ("full", 8, None), ("full", 16, None), ("sa", 8, True), ("sa", 16, False)]
    assert rows[3]["verdict"] == WORSE  # a verdict the setting cannot back: compare.md shows "no" beside it
    text = compare.markdown(cfg, rows, [], None)
    assert "| Headroom |" in text and f"| {WORSE} | no | 40 | 2/1 |" in text and f"| {TIED} | yes |" in text
    assert compare.summary(rows, None).splitlines()[1] == (
        f"compare: SA − SWA (equal w): 1 {TIED}, 1 {WORSE}; where full attention beats SWA (1 of 2): 1 {TIED}")


def test_lm_eval_samples_become_compact_records_keyed_for_pairing():
    from sa_lightning.eval.harness import item_records

    samples = [{"doc_id": 3, "filter": "none", "metrics": ["acc", "acc_norm"], "acc": 1.0, "acc_norm": True,
                "filtered_resps": [(-1.5, False), (-0.5, True)], "target": 1},
               {"doc_id": 3, "filter": "strict", "metrics": ["acc"], "acc": 0.0, "filtered_resps": ["x"]},
               {"doc_id": 4, "filter": "none", "metrics": ["exact_match"], "exact_match": 0,
                "filtered_resps": ["42"]}]
    assert item_records(samples, prefix="mmlu_law") == [
        {"doc_id": "mmlu_law/3", "scores": {"acc": 1.0, "acc_norm": 1.0}, "ll": [-1.5, -0.5], "target": 1},
        {"doc_id": "mmlu_law/4", "scores": {"exact_match": 0.0}}]


@pytest.mark.parametrize("args, message", [
    (["--comparisons", "[{a: sa, b: swx}]"], r"comparisons\[0\] b: unknown attention variant 'swx'"),
    (["--comparisons", "[{a: sa, b: swa, match: same}]"], "match must be one of equal_w, double_w, equal_keys"),
    (["--comparisons", "[{a: sa}]"], "must be a mapping with keys a, b"),
    (["--compare"], "holds none of this config's"),
])
def test_bad_comparisons_fail_in_one_sentence_before_any_cell(args, message, tmp_path):
    from sa_lightning.experiments.sweep import main

    with pytest.raises(ValueError, match=message):
        main(["--model", "nowhere", "--tasks", "[shakespeare_lastword]", "--modes", "[full, swa, sa]",
              "--out", str(tmp_path), *args])
    assert not list((tmp_path / "cells").glob("*")) if (tmp_path / "cells").exists() else True


@pytest.mark.slow
def test_the_regime_sweep_puts_every_mode_against_w_over_n(tiny_model, tmp_path):
    """Issue 35 item 3 with the shipped regime config, changed only in size: ΔNLL against full and the paired
    comparisons at every (n, w_eff), in compare.md's regime table, compare.json and regime.png."""
    from sa_lightning.experiments.sweep import main

    out = tmp_path / "regime"
    result = main(["--config", "configs/sweep/smollm2_regime.yaml", "--model", str(tiny_model),
                   "--tasks", "[position_ppl_64, position_ppl_128]", "--windows", "[8, 16]", "--seeds", "[0, 1]",
                   "--moba_block_sizes", "[4, 16]",
                   "--task_limits", "{position_ppl_64: 2, position_ppl_128: 2}", "--out", str(out)])
    regime = json.loads((out / "compare.json").read_text())["regime"]
    deltas = [r for r in regime if r["kind"] == "delta"]
    sparse = {"swa", "sa", "random", "strided", "sa_swa_union", "random_swa_union", "strided_swa_union", "moba"}
    assert {r["a"] for r in deltas} == sparse and {r["n"] for r in deltas} == {64, 128}
    for r in deltas:
        assert r["ratio"] == r["w_eff"] / r["n"] and r["lo"] <= r["mean"] <= r["hi"]
        assert r["seeds"] == (2 if r["a"] in ("sa", "random", "sa_swa_union", "random_swa_union") else 1)  # all that draw
    paired = {(r["a"], r["b"], r["match"]) for r in regime if r["kind"] == "paired"}
    assert {("sa", "swa", "equal_w"), ("sa", "random", "equal_w"), ("sa", "strided", "equal_w"),
            ("sa_swa_union", "swa", "double_w"), ("sa_swa_union", "random_swa_union", "equal_w")} <= paired
    text = result["compare"]
    assert "## The regime: ΔNLL against full attention by prompt length n and window w_eff" in text
    assert "SA − Random (equal w)" in text and "| 4 | 8 | 64 | 0.125 |" in text
    assert (out / "regime.png").stat().st_size > 10_000


def test_the_short_prompt_sweep_puts_sa_against_swa_at_equal_keys_with_and_without_sinks(tiny_model, tmp_path):
    """Issue 49 item 4 with the shipped short-prompt config, changed only in size: the last-word task, SA against
    SWA at equal w and at equal keys and against Random, each window with and without sinks."""
    from sa_lightning.experiments.sweep import main

    out = tmp_path / "short"
    result = main(["--config", "configs/sweep/smollm2_short.yaml", "--model", str(tiny_model), "--windows", "[8]",
                   "--limit", "5", "--out", str(out)])
    rows = json.loads((out / "results.json").read_text())["rows"]
    assert {(r["mode"], r["sink"]) for r in rows if r["mode"] != "full"} == \
        {(m, k) for m in ("swa", "sa", "random") for k in (0, 4)}
    assert all("shakespeare_lastword" in r and "shakespeare_choice" not in r for r in rows)
    compared = json.loads((out / "compare.json").read_text())["comparisons"]
    want = {("sa", "swa", "equal_keys"), ("sa", "random", "equal_w"), ("full", "swa", "equal_w")}
    assert {(c["a"], c["b"], c["match"]) for c in compared} >= want
    assert "| SA | SWA | equal keys | LW |" in result["compare"] and "| SA+sink4 | SWA+sink4 | equal keys | LW |" in \
        result["compare"]


def test_position_documents_score_the_same_alone_or_batched(tiny_model):
    """Documents of one length go several to a forward pass; SA draws each row's σ from its own tokens, so the
    per-token losses are the same as one document at a time."""
    from sa_lightning.eval.position import position_records
    from sa_lightning.experiments.sweep import load_model
    from sa_lightning.inference.plan import SweepConfig
    from sa_lightning.models.patcher import patch

    model, tokenizer = load_model(SweepConfig(model=str(tiny_model), dtype="float32", device_map="cpu"))
    for mode in ("sa", "random"):
        patch(model, mode, 8, seed=3)
        alone = position_records(model, tokenizer, 64, limit=5, batch_tokens=64)
        batched = position_records(model, tokenizer, 64, limit=5, batch_tokens=256)
        for a, b in zip(alone[1], batched[1]):
            np.testing.assert_allclose(a["nll"], b["nll"], atol=2e-4)


def test_a_drawing_mode_run_at_one_seed_is_named_in_the_tables_notes():
    """Random and SA+SWA (the union) draw at random; where the config runs them at one seed (seed_modes: [sa]), the notes of
    table.md and compare.md say that their intervals lack the draw-to-draw spread; where every drawing mode runs
    several seeds, nothing is said."""
    from sa_lightning.inference.compare import markdown, method_note, one_draw_note

    cfg = SweepConfig(model="m", tasks=[T], modes=["full", "swa", "sa", "random", "sa_swa_union"], windows=[8],
                      seeds=[0, 1, 2, 3, 4], seed_modes=["sa"])
    note = one_draw_note(cfg)
    assert note.startswith("Random, SA+SWA draw at random but ran one seed here (seed 0; the config's seeds and seed_modes)")
    assert "SA," not in note and note in method_note(cfg) and note in markdown(cfg, [], [], None)
    assert one_draw_note(replace(cfg, seed_modes=["sa", "random", "sa_swa_union"])) == ""
    assert one_draw_note(replace(cfg, seeds=[3])).startswith("SA, Random, SA+SWA draw at random but ran one seed here "
                                                              "(seed 3")


@pytest.mark.slow  # two sweep processes at once
def test_two_array_tasks_run_side_by_side_in_one_folder_and_the_report_joins_them(tiny_model, tmp_path):
    """A SLURM array's tasks (``--cells_only``) each took the folder's lock, so overlapping tasks exited 1 "in use
    by pid N" (issue 66): now they hold it shared, write their own cells and no tables, and a whole run or the
    report (``--compare``) waits for none of them once they end."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    out = tmp_path / "sweep"
    base = [sys.executable, str(root / "cli.py"), "sweep", "--model", str(tiny_model), "--dtype", "float32",
            "--device_map", "cpu", "--tasks", "[shakespeare_lastword]", "--windows", "[8]", "--seeds", "[0]",
            "--limit", "4", "--comparisons", "[{a: sa, b: swa, match: equal_w}]", "--out", str(out)]
    env = {**__import__("os").environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    tasks = [subprocess.Popen([*base, "--modes", f"[{mode}]", "--cells_only"], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for mode in ("sa", "swa")]
    said = [t.communicate(timeout=240)[0] for t in tasks]
    assert [t.returncode for t in tasks] == [0, 0], said
    assert all("--cells_only: 1 cells" in s for s in said), said
    assert {p.name for p in (out / "cells").glob("*.json")} == {"sa_w8_s0_shakespeare_lastword.json",
                                                                 "swa_w8_s0_shakespeare_lastword.json"}
    assert not (out / "table.md").exists()  # the tables are the report's
    from sa_lightning.experiments.sweep import main  # the report job, in this process (one interpreter start fewer)

    main([*base[3:], "--modes", "[sa, swa]", "--compare"])
    assert "| SA | SWA | equal w | LW |" in (out / "compare.md").read_text()
