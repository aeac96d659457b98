"""The figures hide no data (issue 33): two series with equal values both show, each with its own marker and a
little apart, and no legend lies over a panel. Drawn on small made-up inputs, nothing is saved."""
import argparse
import math

import pytest
import torch

from sa_lightning.analysis import gates
from sa_lightning.analysis.analyze import draw_coverage
from sa_lightning.bench import attention as bench
from sa_lightning.inference import sweep_report
from sa_lightning.inference.plan import SweepConfig
from sa_lightning.utils.report import pyplot


def _lines(ax) -> list:
    """The axis's lines that hold data (not the empty legend proxies)."""
    return [line for line in ax.get_lines() if len(line.get_xdata())]


def _no_legend_over_a_panel(fig, inside: bool = True) -> None:
    """Every legend lies outside every panel that is shown and, with ``inside``, inside the image however it is
    saved (without it, the figure is saved with bbox_inches="tight", which grows the image to hold it)."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    legends = [*fig.legends, *(ax.get_legend() for ax in fig.axes if ax.get_legend())]
    assert legends
    image = fig.bbox
    for legend in legends:
        box = legend.get_window_extent(renderer)
        if inside:
            assert image.x0 - 1 <= box.x0 and box.x1 <= image.x1 + 1 and image.y0 - 1 <= box.y0, (box.bounds, image.bounds)
        for ax in fig.axes:
            if ax.axison:
                assert not box.overlaps(ax.get_window_extent(renderer)), (legend, ax.get_title())


def _side_by_side(a, b) -> None:
    """Two lines with the same y values: different markers, and every x of one beside the other's."""
    assert list(a.get_ydata()) == list(b.get_ydata())
    assert a.get_marker() != b.get_marker()
    assert all(xa != xb for xa, xb in zip(a.get_xdata(), b.get_xdata()))


@pytest.mark.parametrize("forward_only", [False, True])
def test_bench_figure_shows_equal_variants_side_by_side(forward_only):
    """SA's and SWA's peak memory are equal; at 16k full attention's time is MoBA's (the CPU table's case)."""
    rows = [{"n": n, "variant": v, "ms": ms * n, "peak_mib": mib * n}
            for n in (1024, 2048) for v, ms, mib in (("full", 3.0, 1.0), ("swa", 1.0, 2.0), ("sa", 1.0, 2.0),
                                                     ("moba", 3.0, 4.0))]
    args = argparse.Namespace(window=256, variants=["full", "swa", "sa", "moba"], forward_only=forward_only,
                              no_memory=False)
    fig = bench.draw(rows, args)
    try:
        latency, memory = fig.axes
        assert latency.get_ylabel() == ("ms (forward only)" if forward_only else "ms (forward+backward)")
        for ax in (latency, memory):
            lines = {line.get_label(): line for line in _lines(ax)}
            assert set(lines) == {"Full (SDPA)", "SWA", "SA", "MoBA"}
            _side_by_side(lines["SWA"], lines["SA"])
            assert [t.get_text() for t in ax.get_xticklabels()] == ["1k", "2k"]
        _side_by_side(*({line.get_label(): line for line in _lines(latency)}[k] for k in ("Full (SDPA)", "MoBA")))
        _no_legend_over_a_panel(fig)
    finally:
        pyplot().close(fig)


def test_bench_figure_without_memory_has_one_panel():
    rows = [{"n": 1024, "variant": "swa", "ms": 1.0, "peak_mib": math.nan}]
    fig = bench.draw(rows, argparse.Namespace(window=8, variants=["swa"], forward_only=False, no_memory=True))
    try:
        assert len(fig.axes) == 1 and len(_lines(fig.axes[0])) == 1
    finally:
        pyplot().close(fig)


def test_coverage_figure_shows_equal_curves_side_by_side():
    """SA and SA+SWA cover the sequence after the same few layers: both curves show, on a log depth axis."""
    rising = torch.tensor([0.001, 0.4, 1.0, 1.0, 1.0], dtype=torch.float64)
    fig = draw_coverage({"sa": rising, "swa": torch.linspace(0.001, 1.0, 5, dtype=torch.float64),
                         "sa_swa": rising.clone()}, "coverage")
    try:
        (ax,) = fig.axes
        lines = {line.get_label(): line for line in _lines(ax)}
        _side_by_side(lines["SA"], lines["SA+SWA"])
        assert ax.get_xscale() == "log" and min(lines["SA"].get_xdata()) > 0  # layer 0 (1/n for all) left out
        _no_legend_over_a_panel(fig)
    finally:
        pyplot().close(fig)


def test_gates_figure_shows_both_paths_and_no_legend_over_a_panel():
    """Where g_sa and g_swa are equal, the SA circle shows inside the hollow SWA square; the legends sit in a
    strip below the panels, inside the image even when it is saved without bbox_inches="tight"."""
    values = torch.full((1, 2, 64), 0.3)
    data = {layer: {path: {"gate": values, "distance": values} for path in gates.PATHS} for layer in range(2)}
    buckets = [{"layer": layer, "path": path, "axis": axis, "lo": lo, "hi": hi, "count": 100, "mean": 0.3}
               for layer in range(2) for path in gates.PATHS
               for axis, bins in (("query_position", gates.position_bins(64)),
                                  ("relative_read_distance", [(b / 10, (b + 1) / 10) for b in range(10)]))
               for lo, hi in bins]
    fig = gates.draw(data, buckets, "gates")
    try:
        for ax in fig.axes[1:]:
            lines = _lines(ax)
            assert len(lines) == 4  # 2 layers x 2 paths
            sa, swa = lines[0], lines[1]
            assert sa.get_marker() != swa.get_marker() and swa.get_markerfacecolor() == "none"
            assert swa.get_markersize() > sa.get_markersize()
            assert lines[0].get_color() != lines[2].get_color()  # one colour per layer
        _no_legend_over_a_panel(fig)
    finally:
        pyplot().close(fig)


def _sweep_table(modes):
    """Rows where every mode has the same perplexity in every bucket and the same score."""
    pos = {"ppl@1-63": 100.0, "ppl@64-127": 50.0}
    return [{"mode": mode, "w_eff": w, "sink": 0, "position_ppl_1k": 40.0, "avg": 10.0, "kpq": float(w),
             "kpq:position_ppl_1k": float(w), "pos:position_ppl_1k": dict(pos)}
            for mode in modes for w in (16, 32)]


def test_sweep_position_figure_shows_equal_modes_side_by_side(monkeypatch, tmp_path):
    figures = {}
    monkeypatch.setattr(sweep_report, "_save", lambda fig, path: figures.setdefault(path.name, fig) and path)
    cfg = SweepConfig(model="m", tasks=["position_ppl_1k"], modes=["swa", "sa"], windows=[16, 32])
    sweep_report.position_plot(cfg, _sweep_table(["swa", "sa"]), tmp_path / "position.png")
    fig = figures["position.png"]
    try:
        for ax in (ax for ax in fig.axes if ax.axison):
            lines = {line.get_label(): line for line in _lines(ax)}
            _side_by_side(lines["SWA"], lines["SA"])
        _no_legend_over_a_panel(fig, inside=False)  # the sweep's figures are saved with bbox_inches="tight"
    finally:
        pyplot().close(fig)


def test_every_figure_is_closed_after_its_write_also_when_the_write_fails(tmp_path, monkeypatch):
    """``save_figure`` is how every command writes a figure: the file lands whole and the figure is closed, and a
    write that fails (a full disk) closes it too, so a process that draws on keeps no figure open."""
    import errno

    from sa_lightning.utils import atomic
    from sa_lightning.utils.report import save_figure

    plt = pyplot()
    fig = plt.figure()
    save_figure(fig, tmp_path / "a.png", dpi=40)
    assert (tmp_path / "a.png").read_bytes()[:4] == b"\x89PNG" and fig.number not in plt.get_fignums()

    def full_disk(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(atomic, "savefig", full_disk)
    fig = plt.figure()
    with pytest.raises(OSError, match="No space"):
        save_figure(fig, tmp_path / "b.png")
    assert fig.number not in plt.get_fignums() and not (tmp_path / "b.png").exists()
