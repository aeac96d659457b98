"""``bench cell``: a study cell's time split into its parts, scaled to its whole schedule, against its FLOP floor
(no time is asserted: only that the parts add up to the cell, and the floor is the needed FLOPs at the rate)."""
from __future__ import annotations

import pytest

from sa_lightning.experiments import cell_cost


SMALL = ["--set", "data.init_args.val_examples=8", "--set", "data.init_args.batch_size=4", "--set",
         "model.arch.n_layer=1"]


def test_the_study_cell_is_the_fit_line_the_study_trains(tmp_path):
    """The default cell is ``decide-l4``'s, with its variant, seq_len and ``--set`` swapped into the study's own line."""
    args, cell, spec = cell_cost.study_fit_line("random", 256, {"model.arch.n_layer": 1}, tmp_path)
    assert cell["variant"] == "random" and cell["depth"] == 4 and cell["window"] == 16
    line = dict(zip(args[::2], args[1::2]))
    assert line["--model.arch.attention.variant"] == "random"
    assert line["--data.init_args.seq_len"] == "256" and line["--model.arch.max_seq_len"] == "256"
    assert line["--trainer.max_steps"] == "600" and line["--trainer.default_root_dir"] == str(tmp_path)
    assert line["--model.arch.n_layer"] == "1"  # --set wins over the swap
    assert spec["eval_seeds"] == [0, 1]


@pytest.mark.slow  # trains two short cells
def test_bench_cell_splits_a_cell_and_scales_it_to_its_schedule(tmp_path, capsys):
    rows = cell_cost.main(["--variants", "sa", "full", "--seq_lens", "32", "--steps", "3", "--profile_steps", "1",
                           *SMALL, "--set", "trainer.max_steps=12", "--set", "trainer.val_check_interval=6",
                           "--against", "banded", "--rounds", "1", "--out", str(tmp_path)])
    assert [r["label"] for r in rows] == ["sa n=32", "full n=32"]
    for r in rows:
        assert r["schedule"]["steps"] == 12 and r["schedule"]["validations"] == 2
        assert r["total"] == pytest.approx(sum(r["parts"].values()))
        assert r["training"] == pytest.approx(r["ms_per_step"] / 1000 * 12)
        assert r["floor"] == pytest.approx(r["flops"]["needed"] / r["flops"]["rate"] * 12)
        assert r["flops"]["counted"] > 0 and r["flops"]["rate"] > 0 and r["parts"]["scoring (σ seeds)"] > 0
        assert sum(r["shares"].values()) == pytest.approx((r["parts"]["forward"] + r["parts"]["backward"]))
    assert rows[0]["versus"]["backend"] == "banded" and rows[0]["versus"]["ratio"] > 0
    text = (tmp_path / "cell.md").read_text()
    assert "| **banded × its route** |" in text
    assert "| **training × floor** |" in text and "seeds per core-hour" in text and "load average" in text


def test_bad_input_is_one_line_before_anything_trains(tmp_path):
    with pytest.raises(SystemExit, match="--set takes KEY=VALUE"):
        cell_cost.main(["--set", "oops", "--out", str(tmp_path)])
    with pytest.raises(SystemExit, match="--config nope.yaml is not a file"):
        cell_cost.main(["--config", "nope.yaml", "--out", str(tmp_path)])
    with pytest.raises(SystemExit, match="--against eager compares a compiled cell"):
        cell_cost.main(["--against", "eager", "--out", str(tmp_path)])
    with pytest.raises(SystemExit, match="--variants"):
        cell_cost.main(["--variants", "nope", "--out", str(tmp_path)])
