"""utils.trained: the one home of what a study that trains models reports (issue 48). A study hands over its items
per (setting, arm, training seed); the summaries, comparisons, tables and figures are made here."""
import math

import numpy as np
import pytest

from sa_lightning.utils import atomic, trained
from sa_lightning.utils.stats import BETTER, TIED

ACC = trained.Outcome("acc", "accuracy", scale=100, spec=".1f", unit="points")
NLL = trained.Outcome("nll", "Val. PPL ↓", True, spec=".2f", unit="nats", transform=math.exp,
                      diff_name="NLL/token ↓", diff_spec=".3f")


def _units(shifts: dict[str, float], seeds: int = 6, items: int = 50, seed_sd: float = 0.05) -> trained.Units:
    """Each arm's items per training seed: a seed moves every item of its models by one shared draw."""
    rng = np.random.default_rng(0)
    base, by_seed = rng.normal(0.5, 0.1, items), rng.normal(0, seed_sd, seeds)
    return {arm: {s: list(base + by_seed[s] + shift + rng.normal(0, 0.01, items)) for s in range(seeds)}
            for arm, shift in shifts.items()}


def test_a_level_prints_through_its_transform_and_a_difference_in_the_items_unit():
    assert NLL.text(math.log(100.0)) == "100.00" and NLL.text(0.0123, signed=True) == "+0.012"
    assert NLL.difference == "NLL/token ↓" and ACC.difference == "accuracy" and ACC.text(0.5) == "50.0"
    assert NLL.text(None) == "–" and ACC.text(math.nan) == "–"


def test_report_summarises_each_setting_and_compares_with_the_settings_own_control():
    units = {("a",): _units({"full": 0.4, "swa": 0.0, "sa": 0.2, "random": 0.2}),
             ("b",): _units({"full": 0.0, "swa": 0.0, "sa": 0.2, "random": 0.0})}
    section = trained.report(units, ACC, [("sa", "random"), ("full", "swa")], control=("full", "swa"),
                             threshold=0.6, order=["full", "swa", "sa", "random"])
    assert [r["arm"] for r in section.summaries[:4]] == ["full", "swa", "sa", "random"]
    rows = {(r["setting"], r["a"]): r for r in section.comparisons}
    assert rows[(("a",), "sa")]["verdict"] == TIED and rows[(("a",), "sa")]["headroom"] is True
    assert rows[(("b",), "sa")]["verdict"] == BETTER and rows[(("b",), "sa")]["headroom"] is False  # no headroom in b
    assert rows[(("a",), "full")]["headroom"] is None  # the control's own row
    assert section.summaries[0]["reached"] == 6 and section.summaries[1]["reached"] == 0
    text = "\n".join(trained.markdown(section, ["setting"], threshold_label="reached", note="a study's own note"))
    assert text.index("## Over training seeds: accuracy") < text.index("a study's own note") < text.index("| A | B |")
    assert "| a | full | 6 |" in text and "6/6" in text and "Power (a paired t test" in text


def test_a_control_may_depend_on_the_pair():
    """study pretrain's case: each comparison's control is SWA at B's window."""
    units = _units({"full": -0.3, "swa@32": 0.0, "swa@64": -0.3, "sa@32": 0.0, "sa_swa@32": -0.3})
    seen = []

    def control(a, b):
        seen.append((a, b))
        return ("full", "swa@" + b.split("@")[1])

    rows = trained.comparisons(units, [("sa@32", "swa@32"), ("sa_swa@32", "swa@64")], NLL, control=control)
    assert [r["headroom"] for r in rows] == [True, False] and len(seen) == 2


def test_within_seed_pairs_one_seeds_items_and_never_mixes_seeds():
    units = _units({"full": 0.4, "swa": 0.0, "sa": 0.1}, seeds=3)
    rows = trained.within_seed(units, [("sa", "swa")], ACC, control=("full", "swa"), key=("x",))
    assert [r["seed"] for r in rows] == [0, 1, 2] and all(r["headroom"] is True for r in rows)
    for r in rows:
        assert r["mean_a"] - r["mean_b"] == pytest.approx(r["mean"]) and r["items"] == 50 and r["verdict"] == BETTER
    with pytest.raises(ValueError, match="the same items in the same order"):
        trained.within_seed({"a": {0: [1.0, 2.0]}, "b": {0: [1.0]}}, [("a", "b")], ACC)
    lines = trained.within_seed_table([{**r, "setting": ("x",)} for r in rows], ACC, ["s"])
    assert lines[0].startswith("| s | seed | A | B |") and len(lines) == 5


def test_the_wide_table_is_the_papers_layout_and_says_a_range_under_five_seeds():
    five, three = _units({"swa": 0.0, "sa": 0.1}), _units({"swa": 0.0, "sa": 0.1}, seeds=3)
    sections = [trained.report({(): five}, ACC, []), trained.report({(): three}, NLL, [])]
    lines = trained.wide_table(sections, ["swa", "sa", "absent"], label=str.upper, extra={"note": lambda a: a[0]})
    assert lines[0] == "| Model | accuracy | Val. PPL ↓ | Seeds | note |" and len(lines) == 4
    sa = lines[3]
    assert sa.startswith("| SA | ") and "3 seeds: range [" in sa and "| 6 | s |" in sa
    assert f"{math.exp(np.mean([np.mean(v) for v in three['sa'].values()])):.2f}" in sa  # a perplexity, not an NLL


def _captured(monkeypatch):
    figures = []
    real = atomic.savefig  # every figure is written through it (utils.report.save_figure)
    monkeypatch.setattr(atomic, "savefig", lambda fig, path, **kw: (figures.append(fig), real(fig, path, **kw)))
    return figures


def test_figures_draw_every_seed_and_interval(tmp_path, monkeypatch):
    figures = _captured(monkeypatch)
    three = _units({"swa": 0.0, "sa": 0.1}, seeds=3)
    section = trained.report({("a",): three, ("b",): _units({"swa": 0.0}, seeds=1)}, NLL, [])
    panels = trained.panels(section, lambda s: f"setting {s[0]}")
    assert [p[0] for p in panels] == ["setting a", "setting b"]
    trained.figure(panels, tmp_path / "seeds.png", lambda arm: ("C0", "o", arm), "a title")
    ax = figures[0].axes[0]
    sa = next(r for r in section.summaries if r["arm"] == "sa" and r["setting"] == ("a",))
    means = [line.get_ydata()[0] for line in ax.lines if len(line.get_xdata()) == 1 and line.get_marker() == "o"]
    assert means[1] == pytest.approx(math.exp(sa["mean"]))  # a perplexity drawn, not its NLL
    dots = sorted(ax.collections[-1].get_offsets()[:, 1])  # sa's seeds, each as it prints
    assert dots == pytest.approx(sorted(math.exp(v) for v in sa["per_seed"].values()))
    bars = [c for c in ax.collections if c.get_linestyle() and c.get_linestyle()[0][1] is not None]
    assert bars  # three seeds: their range, dashed
    series = [{"label": arm, "color": "C1", "marker": "^", "x": [4, 16, 64], "reference": arm == "full",
               "dotted": arm == "sa4", "per_seed": [[0.9, 0.5, 0.2 + s / 10] for s in range(n)]}
              for arm, n in (("full", 3), ("sa", 6), ("sa4", 3), ("swa", 1))]
    trained.profile([{"title": "one", "series": series, "lines": [(30, "field")]}], tmp_path / "profile.png",
                    "a title", "distance", "accuracy", ylim=(0, 1))
    ax = figures[1].axes[0]
    drawn = {line.get_label(): line for line in ax.lines}
    assert list(drawn["sa"].get_ydata()) == pytest.approx([0.9, 0.5, 0.2 + 2.5 / 10])  # the mean over six seeds
    assert drawn["sa"].get_xdata()[0] != drawn["sa4"].get_xdata()[0]  # side by side, not on top of each other
    assert drawn["full"].get_linewidth() > drawn["sa"].get_linewidth()  # the reference band under the rest
    assert not any(line.get_label() == "swa" and len(line.get_xdata()) != 3 for line in ax.lines)
    assert [t.get_text() for t in ax.texts] == ["field"] and ax.get_ylim() == (0, 1)
