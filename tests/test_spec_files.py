"""A study cell's spec fingerprints every file its fit config names (issue 78): ``model.init_weights: FILE`` inside
the fit config, a data file or tokenizer, a config named inside the config and the files it names, a file inside an
override's nested value. After such a file was replaced, a rerun said "done before" and reported the old model."""
import json

from sa_lightning.experiments import long_range, pretrain
from sa_lightning.experiments.training import trained_checkpoint
from sa_lightning.utils import runner
from tests.helpers import ROOT

STUDY = str(ROOT / "configs/study/pretrain.yaml")


def _cell_spec(tmp_path, fit_config, overrides=None):
    """The spec of the pretrain study's first cell with ``fit_config`` (and ``fit_overrides``) swapped in."""
    experiment = pretrain.EXPERIMENT
    cfg = experiment.load(STUDY, None, {"models": ["sa@32"], "seeds": [0], "fit_config": str(fit_config),
                                        **({"fit_overrides": overrides} if overrides else {})})
    (cell,) = experiment.cells(cfg)
    return experiment, experiment.spec(cell, cfg, tmp_path / "out")


def _done_before(experiment, saved_spec, spec) -> bool:
    """What the runner asks of a cell on disk (``runner.stands_for``: ``reuse``), and whether its trained model
    would be scored again instead of trained (``trained_checkpoint``'s inputs)."""
    saved = {"spec": json.loads(json.dumps(saved_spec))}
    return experiment.reuse(saved, spec) and saved["spec"].get("inputs") == spec.get("inputs")


def test_replacing_a_file_named_inside_the_fit_config_makes_the_cell_train_again(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # relative paths resolve where the fit runs
    (tmp_path / "w.ckpt").write_bytes(b"first weights")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "data.yaml").write_text("tokenizer: tok.json\n")  # relative to its own folder
    (tmp_path / "sub" / "tok.json").write_text('{"v": 1}')
    (tmp_path / "train.txt").write_text("some text\n")
    fit = tmp_path / "fit.yaml"
    fit.write_text("model:\n  init_weights: w.ckpt\n  arch: {n_layer: 2}\n"
                   "data: sub/data.yaml\ntrainer: {default_root_dir: runs, max_steps: 3}\n")
    experiment, before = _cell_spec(tmp_path, fit, {"data.train": {"kind": "files", "paths": ["train.txt"]}})
    assert _done_before(experiment, before, before)
    for path, other in (("w.ckpt", b"other weights"), ("sub/tok.json", b'{"v": 2}'), ("train.txt", b"more text\n")):
        kept = (tmp_path / path).read_bytes()
        (tmp_path / path).write_bytes(other)  # the same path, other bytes
        _, after = _cell_spec(tmp_path, fit, {"data.train": {"kind": "files", "paths": ["train.txt"]}})
        assert after["fit_args"] == before["fit_args"] and not _done_before(experiment, before, after), path
        assert trained_checkpoint({"spec": before}, after) is None  # not scored again from the old model
        (tmp_path / path).write_bytes(kept)
    _, again = _cell_spec(tmp_path, fit, {"data.train": {"kind": "files", "paths": ["train.txt"]}})
    assert again == before  # the same bytes: done before
    assert {"w.ckpt", "sub/data.yaml", "tok.json", "train.txt"} <= {
        part.split("=")[0] for part in before["inputs"].split(";")[1:]}


def test_a_cell_whose_config_names_no_file_keeps_its_spec(tmp_path, monkeypatch):
    """Where nothing but the config is named, ``inputs`` is the config's own fingerprint, as before the files inside
    it counted: no finished cell of the shipped studies is trained again."""
    monkeypatch.chdir(ROOT)
    for experiment, study, overrides in (
            (pretrain.EXPERIMENT, STUDY, {"models": ["sa@32"], "seeds": [0]}),
            (long_range.EXPERIMENT, str(ROOT / "configs/study/long_range.yaml"),
             {"variants": ["sa"], "seeds": [0], "depths": [2], "windows": [8], "tasks": ["passkey"]})):
        cfg = experiment.load(study, None, overrides)
        for cell in experiment.cells(cfg):
            spec = experiment.spec(cell, cfg, tmp_path)
            config, _ = experiment.fit_swaps(cell, cfg)
            assert spec["inputs"] == runner.fingerprint(config), (study, cell)
    fit = tmp_path / "fit.yaml"
    fit.write_text("model: {arch: {n_layer: 2}}\ndata: {tokenizer: embedded}\ntrainer: {default_root_dir: runs}\n")
    _, spec = _cell_spec(tmp_path, fit)
    assert spec["inputs"] == runner.fingerprint(fit)
