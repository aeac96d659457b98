"""A sweep reuses a finished cell only when what made it matches (issue 33): run into an older sweep's folder with
another model or limit, it says what differs in one sentence instead of reporting the old scores as its own."""
import json

import pytest
import torch


@pytest.fixture(scope="module")
def two_models(tmp_path_factory):
    """Two tiny random Qwen3 folders with the embedded tokenizer."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from sa_lightning.data.tokenizer import load_tokenizer

    tok = load_tokenizer("embedded")
    folders = []
    for seed in (0, 1):
        folder = tmp_path_factory.mktemp(f"qwen3_{seed}")
        torch.manual_seed(seed)
        sizes = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                     num_key_value_heads=2, head_dim=8, max_position_embeddings=512)
        Qwen3ForCausalLM(Qwen3Config(**sizes, vocab_size=len(tok), eos_token_id=tok.eos_token_id,
                                     pad_token_id=tok.eos_token_id)).save_pretrained(folder)
        tok.save_pretrained(folder)
        folders.append(folder)
    return folders


def test_a_cell_of_another_model_or_limit_is_refused_not_reused(two_models, tmp_path, capsys):
    from sa_lightning.experiments.sweep import main

    def args(model, limit):
        return ["--model", str(model), "--dtype", "float32", "--tasks", "[shakespeare_lastword]", "--modes", "[full]",
                "--limit", str(limit), "--out", str(tmp_path)]

    main(args(two_models[0], 2))
    cell = tmp_path / "cells" / "full_wall_s0_shakespeare_lastword.json"
    assert json.loads(cell.read_text())["spec"]["made_by"]["limit"] == 2.0
    capsys.readouterr()
    main(args(two_models[0], 2))
    assert "1 cells, 1 already done, 0 to run" in capsys.readouterr().out
    for other, differs in ((args(two_models[1], 2), f"model {str(two_models[0])!r} (now {str(two_models[1])!r})"),
                           (args(two_models[0], 3), "limit 2.0 (now 3.0)")):
        with pytest.raises(ValueError, match="was made with other settings: " + differs.replace("(", r"\(")
                           .replace(")", r"\)")):
            main(other)
    assert json.loads(cell.read_text())["spec"]["made_by"]["limit"] == 2.0  # the old cell is untouched


def test_a_model_exported_again_in_place_is_not_the_same_model(two_models, tmp_path, capsys):
    """Issue 48: a sweep whose model folder was re-exported in place with other weights reported "already done"
    with the old model's numbers, since only the path was compared. The weights' fingerprint is in each cell."""
    import shutil

    from sa_lightning.experiments.sweep import main

    model = tmp_path / "model"
    shutil.copytree(two_models[0], model)
    args = ["--model", str(model), "--dtype", "float32", "--tasks", "[shakespeare_lastword]", "--modes", "[full]",
            "--limit", "2", "--out", str(tmp_path / "sweep")]
    main(args)
    for f in two_models[1].iterdir():  # the other weights, exported over the same folder
        shutil.copy(f, model / f.name)
    with pytest.raises(ValueError, match=r"made with other settings: weights '[0-9a-f]{16}' \(now '[0-9a-f]{16}'\)"):
        main(args)


def test_a_seed_named_twice_runs_and_counts_once(two_models, tmp_path, capsys):
    from sa_lightning.experiments.sweep import main

    main(["--model", str(two_models[0]), "--dtype", "float32", "--tasks", "[shakespeare_lastword]",
          "--modes", "[sa]", "--windows", "[8]", "--seeds", "[0, 0]", "--limit", "2", "--out", str(tmp_path)])
    captured = capsys.readouterr()
    assert "sweep seeds: 0 named more than once; each seed counts once (0)" in captured.err
    assert "1 cells, 0 already done, 1 to run" in captured.out
    assert sorted(p.name for p in (tmp_path / "cells").glob("*.json")) == ["sa_w8_s0_shakespeare_lastword.json"]


def test_a_window_a_control_cannot_take_is_refused_before_any_cell(tmp_path):
    from sa_lightning.inference.plan import SweepConfig

    with pytest.raises(ValueError, match=r"sweep windows: random needs a window >= 3 .* Drop that window or that mode"):
        SweepConfig(model="x", modes=["full", "swa", "random"], windows=[2, 8])


@pytest.mark.slow
def test_two_sweeps_into_one_folder_at_once_are_refused(two_models, tmp_path):
    import subprocess
    import sys

    from sa_lightning.utils import runner

    out = tmp_path / "sweep"
    out.mkdir()
    (out / "cells").mkdir()
    held = runner.RunLock(out, runner.LOCK_NAME, what="sweep")
    held.acquire()  # what another process's sweep holds; in this process, taken over only by the same lock
    # the model's bytes are hashed only once the folder is the run's: a folder in use is refused before (it took
    # minutes for an 8B model's 16 GB)
    code = ("import sys; from sa_lightning.experiments import sweep; from sa_lightning.utils import runner; "
            "runner.fingerprint = lambda path: print('HASHED', file=sys.stderr); sweep.main(sys.argv[1:])")
    res = subprocess.run([sys.executable, "-c", code, "--model", str(two_models[0]), "--dtype", "float32",
                          "--tasks", "[shakespeare_lastword]", "--modes", "[full]", "--limit", "2", "--out", str(out)],
                         capture_output=True, text=True)
    held.release()
    assert res.returncode != 0 and "another sweep writing there" in res.stderr
    assert "HASHED" not in res.stderr and not list((out / "cells").iterdir())


@pytest.mark.slow
def test_items_cut_short_are_named_by_compare_and_run_again_by_a_rerun(two_models, tmp_path, capsys):
    """Issue 48: a cut-short ``cells/*.items.jsonl.gz`` gave a 38-line EOFError traceback on ``--compare`` and on a
    plain rerun, which did not rerun the damaged cell."""
    from sa_lightning.experiments.sweep import main

    args = ["--model", str(two_models[0]), "--dtype", "float32", "--tasks", "[shakespeare_lastword]",
            "--modes", "[full, swa]", "--windows", "[8]", "--limit", "5", "--out", str(tmp_path)]
    main(args)
    items = tmp_path / "cells" / "swa_w8_s0_shakespeare_lastword.items.jsonl.gz"
    items.write_bytes(items.read_bytes()[:-10])
    capsys.readouterr()
    main([*args, "--compare"])
    out = capsys.readouterr().out
    assert "2 cells, 1 done, none run (--compare)" in out and "swa_w8_s0_shakespeare_lastword" in out
    assert "cut short" in out
    main(args)
    out = capsys.readouterr().out
    assert "2 cells, 1 already done, 1 to run (1 of them again" in out and "swa_w8_s0_shakespeare_lastword" in out
    assert len(main([*args, "--compare"])["rows"]) == 2


def _earlier(record: dict, form: str) -> dict:
    """Today's record of a cell in the form an earlier version wrote it: ``beside`` (2026-11-27 to 11-29, 491e73a to
    fa41dde: ``made_by`` beside a spec of the patch alone, no ``depth``), ``inside`` (2026-11-29 to 12-07, fa41dde
    to 7976d39: ``made_by`` inside the spec, no ``depth``) or ``unfingerprinted`` (before 2026-11-27: ``beside``,
    without the weights' fingerprint)."""
    record = json.loads(json.dumps(record))
    spec = record["spec"]
    del spec["depth"]
    if form in ("beside", "unfingerprinted"):
        record["made_by"] = spec.pop("made_by")
    if form == "unfingerprinted":
        del record["made_by"]["weights"]
    return record


def test_records_of_an_earlier_version_are_migrated_once_by_a_command(two_models, tmp_path, capsys):
    """Issue 77: the sweep reads one form of record. A folder of records in the forms earlier versions wrote is
    refused in one line that names ``cli.py migrate`` (before, every such cell ran again without a word: hours for
    an 8B model); the migration rewrites those whose cell means the same today and removes the others, which the next
    run scores again; a second migration changes nothing."""
    from sa_lightning.experiments.sweep import main
    from sa_lightning.main import main as cli

    args = ["--model", str(two_models[0]), "--dtype", "float32", "--tasks", "[shakespeare_lastword]", "--modes",
            "[full, swa, sa, strided_local]", "--windows", "[8]", "--limit", "2", "--out", str(tmp_path)]
    main(args)
    cells = tmp_path / "cells"
    path = {mode: cells / f"{mode}_w{'all' if mode == 'full' else 8}_s0_shakespeare_lastword.json"
            for mode in ("full", "swa", "sa", "strided_local")}
    today = {mode: json.loads(p.read_text()) for mode, p in path.items()}
    forms = {"full": "unfingerprinted", "swa": "beside", "sa": "inside", "strided_local": "inside"}
    for mode, form in forms.items():
        path[mode].write_text(json.dumps(_earlier(today[mode], form)))
    with pytest.raises(ValueError, match=r"is a record of an earlier version: `python cli.py migrate .*` brings the "
                                         r"folder's cells to today's form once"):
        main(args)
    capsys.readouterr()
    cli(["migrate", str(tmp_path)])
    said = capsys.readouterr().out
    assert "2 updated; 2 removed" in said and "full_wall_s0_shakespeare_lastword.json (no weights fingerprint)" in said
    assert "strided_local_w8_s0_shakespeare_lastword.json (its pattern is tuned for the model's depth since)" in said
    assert not path["full"].exists() and not path["full"].with_suffix(".items.jsonl.gz").exists()
    assert not path["strided_local"].exists()
    assert all(json.loads(path[mode].read_text()) == today[mode] for mode in ("swa", "sa"))
    cli(["migrate", str(tmp_path)])
    assert "nothing to migrate" in capsys.readouterr().out
    with pytest.raises(ValueError, match="holds no cells/ folder: pass the --out of a sweep"):
        cli(["migrate", str(tmp_path / "cells" / "none")])
    main(args)
    assert "4 cells, 2 already done, 2 to run" in capsys.readouterr().out
    assert json.loads(path["full"].read_text())["spec"]["made_by"]["weights"]


def test_each_cell_file_is_parsed_once_per_run(two_models, tmp_path, monkeypatch):
    """Issue 77: the runner reads each cell's record and items once and hands them to the report, which reads no
    cell file again (a sweep parsed each record six times). A fresh run parses none: its records come from the run."""
    from sa_lightning.experiments.sweep import main
    from sa_lightning.utils import runner

    args = ["--model", str(two_models[0]), "--dtype", "float32", "--tasks", "[shakespeare_lastword, position_ppl_64]",
            "--modes", "[full, swa, sa]", "--windows", "[8]", "--seeds", "[0, 1]", "--limit", "3",
            "--comparisons", "[{a: sa, b: swa}]", "--out", str(tmp_path)]
    counted = runner.PARSES
    counted.clear()
    main(args)
    assert not counted, counted
    names = sorted(p.name for p in (tmp_path / "cells").iterdir() if not p.name.startswith("."))
    assert len(names) == 4 * 2 * 2  # full and swa at one seed, sa at two; two tasks; a record and its items each
    for again in (args, [*args, "--compare"]):
        counted.clear()
        main(again)
        assert sorted(counted) == names and set(counted.values()) == {1}, counted
