"""``cli.py study pretrain`` (issue 35, item 4): Table 1 at micro scale with the controls, over training seeds. Each
cell keeps its items, so that every number carries a two-level interval and two models pair item by item."""
import json
import math

import numpy as np
import pytest

from sa_lightning.study import pretrain
from sa_lightning.utils.stats import BETTER, TIED, WORSE

CONFIG = "configs/study/pretrain.yaml"


def _result(model, seed, nll, lw, mc):
    return {"model": model, "seed": seed, "scores": {"val_ppl": list(nll), "shakespeare_lastword": list(lw),
                                                      "shakespeare_choice": list(mc)}}


def test_models_name_a_variant_and_its_window():
    assert pretrain.parse_model("swa@64") == ("swa", 64) and pretrain.parse_model("full") == ("full", None)
    for bad, needle in (("sa@x", "<variant>@<window>"), ("sa@0", "<variant>@<window>"), ("swaa@32", "swaa")):
        with pytest.raises(ValueError, match=needle):
            pretrain.parse_model(bad)


def test_the_shipped_config_holds_every_control_and_three_seeds(monkeypatch):
    """The issue's grid: random, strided, random_swa and SWA at 2w beside the paper's variants, 3 training seeds."""
    settings = pretrain.load_settings(CONFIG, None, {})
    assert {"full", "swa@32", "sa@32", "sa_swa@32", "random@32", "strided@32", "random_swa@32", "swa@64"} <= \
        set(settings["models"]) and settings["seeds"] == [0, 1, 2]
    assert {"a": "sa_swa@32", "b": "swa@64"} in settings["comparisons"]
    assert {"a": "sa@32", "b": "random@32"} in settings["comparisons"]
    quick = pretrain.load_settings(CONFIG, "quick", {})
    assert quick["out"] != settings["out"]
    with pytest.raises(ValueError, match="each comparison is"):
        pretrain.load_settings(CONFIG, "quick", {"comparisons": [{"a": "full"}]})


def test_intervals_come_from_items_and_seeds_and_verdicts_from_paired_differences():
    rng = np.random.default_rng(0)
    base = rng.normal(5.0, 0.3, size=40)
    lw, mc = rng.integers(0, 2, 30) * 100.0, rng.integers(0, 2, 30) * 100.0
    results = [_result("swa@32", s, base + 0.01 * s, lw, mc) for s in range(3)]
    results += [_result("sa@32", s, base + 0.2 + 0.01 * s, lw, mc) for s in range(3)]  # worse by 0.2 nats on every block
    results += [_result("random@32", s, base + 0.2 + 0.01 * s, lw, mc) for s in range(3)]
    rows = pretrain.rows(results, ["swa@32", "sa@32", "random@32"])
    sa = next(r for r in rows if r["model"] == "sa@32")
    assert sa["val_ppl"] == pytest.approx(math.exp(base.mean() + 0.21), rel=1e-9)
    assert sa["val_ppl:lo"] < sa["val_ppl"] < sa["val_ppl:hi"] and sa["val_ppl:seeds"] == 3
    assert sa["val_ppl:items"] == 40 and sa["val_ppl:seed_sd"] > 0
    text, compared = pretrain.compare(results, [{"a": "sa@32", "b": "swa@32"}, {"a": "sa@32", "b": "random@32"}])
    verdicts = {(c["b"], c["column"]): c["verdict"] for c in compared}
    assert verdicts[("swa@32", "val_ppl")] == WORSE and verdicts[("random@32", "val_ppl")] == TIED
    assert verdicts[("swa@32", "shakespeare_lastword")] == TIED and "SA (w=32)" in text
    assert BETTER not in verdicts.values()
    assert {c["headroom"] for c in compared} == {None}  # no full-attention model here: the control is unknown
    text, _ = pretrain.compare(results, [{"a": "full", "b": "swa@32"}])
    assert "Not compared (a model this run leaves out): Full − SWA (w=32)" in text
    # with full attention better than SWA on the validation blocks only, only those rows have headroom
    results += [_result("full", s, base - 0.3 + 0.01 * s, lw, mc) for s in range(3)]
    text, compared = pretrain.compare(results, [{"a": "full", "b": "swa@32"}, {"a": "sa@32", "b": "random@32"}])
    room = {(c["a"], c["column"]): c["headroom"] for c in compared}
    assert room[("full", "val_ppl")] is None and room[("sa@32", "val_ppl")] is True
    assert room[("sa@32", "shakespeare_lastword")] is False and f"| {TIED} | no |" in text
    table = pretrain.table(rows, {"seeds": [0, 1, 2]})
    assert "two-level percentile bootstrap" in table and "SD over training seeds" in table


def test_a_model_that_draws_is_scored_under_every_sigma_seed_and_its_spread_shown():
    """The shipped eval_seeds go to the models that draw (SA, random, their gated pairs), one to the others; the
    σ spread is the SD over σ seeds of one trained model's score, averaged over its training seeds."""
    settings = pretrain.load_settings(CONFIG, None, {})
    assert len(settings["eval_seeds"]) >= 5
    assert pretrain.eval_seeds("sa@32", settings) == settings["eval_seeds"]
    assert pretrain.eval_seeds("random_swa@32", settings) == settings["eval_seeds"]
    assert pretrain.eval_seeds("swa@32", settings) == pretrain.eval_seeds("strided@32", settings) == [0]
    assert pretrain.eval_seeds("sa@32", {"eval_seed": 3}) == [3]  # a config written before eval_seeds
    draws = [[4.0, 5.0], [4.2, 5.2], [4.4, 5.4]]  # one trained model under three σ seeds: mean NLL 4.5, 4.7, 4.9
    result = {"model": "sa@32", "seed": 0, "eval_seeds": [0, 1, 2],
              "scores_by_eval_seed": [{"val_ppl": d, "shakespeare_lastword": [0.0], "shakespeare_choice": [100.0]}
                                      for d in draws]}
    want = float(np.std([math.exp(4.5), math.exp(4.7), math.exp(4.9)], ddof=1))
    assert pretrain.sigma_sd([result], "sa@32", "val_ppl") == pytest.approx(want)
    assert pretrain.sigma_sd([result], "sa@32", "shakespeare_lastword") == 0.0
    assert pretrain.sigma_sd([_result("swa@32", 0, [4.0], [0.0], [0.0])], "swa@32", "val_ppl") is None


@pytest.mark.slow
def test_a_cell_trains_scores_its_items_and_resumes(tmp_path, capsys):
    """The shipped config changed only in size: one random-keys model, 2 steps, 3 documents per task."""
    args = ["--config", CONFIG, "--models", "random@32", "--seeds", "0", "--limit", "3",
            "--set", "trainer.max_steps=2", "--set", "data.val_blocks=4", "--out", str(tmp_path)]
    (result,) = pretrain.main(args)
    assert result["steps"] == 2 and len(result["scores"]["val_ppl"]) == 4
    # scored under each shipped σ seed, each with its own draws; an item's score is their mean
    by_seed = result["scores_by_eval_seed"]
    assert result["eval_seeds"] == [0, 1, 2, 3, 4] and len(by_seed) == 5
    assert result["scores"]["val_ppl"] == pytest.approx(np.mean([s["val_ppl"] for s in by_seed], axis=0), abs=1e-5)
    assert by_seed[0]["val_ppl"] != by_seed[1]["val_ppl"]  # another σ per block
    assert len(result["scores"]["shakespeare_lastword"]) == 3 == len(result["scores"]["shakespeare_choice"])
    assert (tmp_path / "table.md").is_file() and (tmp_path / "table1.png").stat().st_size > 1000
    saved = json.loads(next((tmp_path / "cells").glob("*.json")).read_text())
    assert saved["scores"] == result["scores"]
    capsys.readouterr()
    pretrain.main(args)  # resumes: the cell is on disk with the same spec
    assert "done before" in capsys.readouterr().out
