"""``analyze map`` (issue 76): the map of where routing could matter, built from finished long-range runs' report
files. The runs here are stand-ins written as a study writes them; reach is computed from the arms' own masks."""
import json

import pytest

from sa_lightning.analysis import routing_map


def _run(folder, n, depth, rows):
    folder.mkdir()
    config = {"fit_overrides": {"data.init_args.seq_len": n}, "depths": [depth], "windows": [16],
              "margins": {"acc": 0.136, "logp": 0.69}}
    (folder / "results.json").write_text(json.dumps({"experiment": "study long-range", "config": config, "rows": []}))
    (folder / "compare.json").write_text(json.dumps({"experiment": "study long-range", "comparisons": rows}))
    return folder


def _row(b, mean, outcome="logp", lo=None, hi=None, verdict="not separable at this size"):
    return {"setting": ["passkey", 4, 16, 1], "a": "sa", "b": b, "outcome": outcome, "mean": mean, "lo": lo,
            "hi": hi, "lo90": None if lo is None else lo + 0.1, "hi90": None if hi is None else hi - 0.1,
            "verdict": verdict, "seeds": 24}


def test_the_map_puts_each_effect_beside_each_arms_reach(tmp_path):
    a = _run(tmp_path / "n128", 128, 4, [_row("random", -0.1, lo=-0.5, hi=0.3, verdict="equivalent within ±0.69"),
                                          _row("swa", 2.0, lo=1.2, hi=2.8, verdict="better"),
                                          _row("random", -0.05, outcome="acc")])
    b = _run(tmp_path / "n256", 256, 2, [_row("strided_local", 0.9, lo=0.2, hi=1.6, verdict="better")])
    rows = routing_map.main([str(b), str(a), "--trials", "2", "--out", str(tmp_path / "map")])
    assert [(r["n"], r["L"], r["b"]) for r in rows] == [(128, 4, "random"), (128, 4, "swa"), (256, 2, "strided_local")]
    by = {(r["n"], r["b"]): r for r in rows}
    assert by[(128, "swa")]["reach_b"] == 0.0  # SWA's masks reach nothing past its own field
    assert by[(128, "random")]["reach_a"] > 0.9  # at n = 128, L = 4 SA reaches nearly everything (Table 16)
    assert by[(256, "strided_local")]["reach_a"] > by[(256, "strided_local")]["reach_b"]  # Table 16d, L = 2
    text = (tmp_path / "map" / "map.md").read_text()
    assert "| 128 | 4 | 16 | SA − Random | -0.100 | [-0.500, +0.300] | [-0.400, +0.200] | 0.69 | equivalent" in text
    assert {p.name for p in (tmp_path / "map").iterdir() if not p.name.startswith(".")} >= \
        {"map.md", "map.csv", "map.png"}


def test_a_folder_without_a_finished_report_is_named(tmp_path):
    (tmp_path / "half").mkdir()
    with pytest.raises(ValueError, match="half holds no finished long-range report"):
        routing_map.main([str(tmp_path / "half"), "--out", str(tmp_path / "map")])
