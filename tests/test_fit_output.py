"""What ``cli.py fit`` and ``test`` print when their output is a file or a pipe (issue 33): plain progress lines
and the final metrics instead of a bar's last frame, none of Lightning's advertising or deprecation lines that a
user cannot act on, and ``fit --help`` naming the attention variants from the registry."""
import io
import json
import logging
import math
import re
import sys
import warnings
from pathlib import Path

import pytest

from sa_lightning.attention.registry import VARIANTS
from sa_lightning.lit.callbacks import LineProgress
from sa_lightning.lit.cli import wants_line_progress
from sa_lightning.utils.quiet import quiet_lightning
from tests.helpers import run_cli, run_cli_here

ROOT = Path(__file__).resolve().parents[1]
BASE = ["--config", str(ROOT / "configs/tiny.yaml"), "--config", str(ROOT / "tests/configs/fast.yaml")]
# the lines a user can do nothing about (Lightning's advertising, torch's deprecation that Lightning triggers,
# ModelCheckpoint's dirpath note on every checkpoint `test` loads) and a live bar's last frame
NOISE = ("💡 Tip", "litlogger", "litmodels", "LeafSpec", "`weights_only` was not set", "The dirpath has changed",
         "0.00it/s")
NUMBER = r"[\d,]+\.\d+"


@pytest.mark.slow
def test_fit_and_test_into_a_pipe_print_plain_lines_and_no_noise(tmp_path):
    """A 6-step fit and a ``test`` of its last.ckpt, each with stdout a pipe (not a terminal), as ``> log.txt
    2>&1`` gives; Lightning's default logger (a new version per run) as in the shipped configs. One test, so
    that ``pytest -n`` runs the two processes once."""
    common = [*BASE, "--trainer.enable_progress_bar", "true", "--trainer.logger", "true",
              "--trainer.default_root_dir", str(tmp_path)]
    callbacks = ["--trainer.callbacks", json.dumps([
        {"class_path": "lightning.pytorch.callbacks.ModelCheckpoint", "init_args": {"every_n_train_steps": 3}},
        {"class_path": "sa_lightning.lit.CheckpointAtEnd"}])]
    fit = run_cli("fit", *common, *callbacks, "--trainer.log_every_n_steps", "2")
    assert fit.returncode == 0, fit.stdout[-3000:] + fit.stderr[-3000:]

    # fit: a line every log_every_n_steps (2) optimizer steps, one per validation, the final metrics
    out = fit.stdout
    steps = re.findall(rf"^step (\d+)/6 \| loss {NUMBER} \| lr [\d.]+e[-+]\d+ \| [\d,]+ tokens/s \| [\d.e+-]+ it/s \| "
                       r"\d+:\d\d:\d\d elapsed, ~\d+:\d\d:\d\d left$", out, re.M)
    assert steps == ["2", "4", "6"], out
    assert re.findall(r"^validation at step (\d+): val/loss", out, re.M) == ["3", "6"], out
    assert re.search(r"^fit done: step 6/6 in \d+:\d\d:\d\d \([\d,]+ tokens/s, [\d.e+-]+ it/s", out, re.M), out
    assert re.search(rf"^final train/loss {NUMBER}$", out, re.M), out
    final = re.search(rf"^final validation \(step 6\): val/loss ({NUMBER}) \| val/ppl ({NUMBER})", out, re.M)
    assert final, out
    loss, ppl = (float(v.replace(",", "")) for v in final.groups())
    assert ppl == pytest.approx(math.exp(loss), rel=1e-3)
    assert "Epoch 0" not in out and "\r" not in out  # no bar, nothing redrawn over itself
    both = fit.stdout + fit.stderr
    assert not [n for n in NOISE if n in both], both
    assert "`Trainer.fit` stopped: `max_steps=6` reached." in both  # Lightning's other lines still reach the user

    # test of the checkpoint: into a new logger version (ModelCheckpoint's dirpath note), Lightning's table kept
    (ckpt,) = tmp_path.rglob("last.ckpt")
    test = run_cli("test", *common, *callbacks, "--ckpt_path", str(ckpt))
    assert test.returncode == 0, test.stdout[-3000:] + test.stderr[-3000:]
    both = test.stdout + test.stderr
    assert not [n for n in NOISE if n in both], both
    assert "\r" not in test.stdout
    assert "Restoring states from the checkpoint" in both and "test/ppl" in test.stdout


def test_line_progress_only_where_output_is_not_a_terminal_and_the_bar_is_wanted():
    from lightning.pytorch.callbacks import TQDMProgressBar

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    assert not wants_line_progress({}, stream=Terminal())  # a terminal keeps Lightning's bar
    assert wants_line_progress({}, stream=io.StringIO())
    assert wants_line_progress({"enable_progress_bar": None, "callbacks": None}, stream=io.StringIO())
    assert not wants_line_progress({"enable_progress_bar": False}, stream=io.StringIO())
    assert not wants_line_progress({"callbacks": [TQDMProgressBar()]}, stream=io.StringIO())  # the config's own bar
    assert not wants_line_progress({}, {"callbacks": TQDMProgressBar()}, stream=io.StringIO())


def test_line_progress_prints_on_global_rank_zero_only():
    class Trainer:
        is_global_zero = False

    out = io.StringIO()
    bar = LineProgress(stream=out)
    bar.setup(Trainer(), None, "fit")  # ProgressBar.setup disables it on every other rank
    assert not bar.is_enabled
    bar._say(Trainer(), "step 1/2")
    Trainer.is_global_zero = True
    bar._say(Trainer(), "step 2/2")  # still disabled: set up on a rank other than 0
    assert out.getvalue() == ""
    bar.enable()
    bar._say(Trainer(), "step 2/2")
    assert out.getvalue() == "step 2/2\n"
    with pytest.raises(ValueError, match="every_n_steps"):
        LineProgress(every_n_steps=0)


def test_quiet_lightning_drops_exactly_the_adverts_and_the_deprecation_a_user_cannot_act_on():
    records = []

    class Keep(logging.Handler):
        def emit(self, record):
            records.append(record.getMessage())

    log = logging.getLogger("lightning.pytorch.utilities.rank_zero")
    handler = Keep()
    log.addHandler(handler)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            quiet_lightning("test")
            log.warning("💡 Tip: For seamless cloud logging and experiment tracking, try installing [litlogger](...)")
            log.warning("💡 Tip: For seamless cloud uploads and versioning, try installing [litmodels](...)")
            log.warning("Restoring states from the checkpoint path at x.ckpt")
            warnings.warn("`isinstance(treespec, LeafSpec)` is deprecated, use `isinstance(treespec, TreeSpec) "
                          "and treespec.is_leaf()` instead.", FutureWarning)
            warnings.warn("The dirpath has changed from 'a' to 'b', therefore `best_model_score` ... won't be "
                          "reloaded. Only `best_model_path` will be reloaded.", UserWarning)
            warnings.warn("`isinstance(treespec, LeafSpec)` is deprecated", UserWarning)  # another category: kept
            warnings.warn("some other deprecation", FutureWarning)
    finally:
        log.removeHandler(handler)
    assert records == ["Restoring states from the checkpoint path at x.ckpt"]
    assert [str(w.message) for w in caught] == ["`isinstance(treespec, LeafSpec)` is deprecated",
                                                "some other deprecation"]


def test_fit_help_names_every_registered_variant(monkeypatch):
    monkeypatch.setitem(VARIANTS, "my_variant", VARIANTS["full"])  # one registered by a user: listed too
    proc = run_cli_here("fit", "--help")
    assert proc.returncode == 0, proc.stderr
    block = re.search(r"--model\.arch\.attention\.variant VARIANT\n(.*?)\n  --", proc.stdout, re.S)
    assert block, proc.stdout[:2000]
    help_text = " ".join(block.group(1).split())
    assert f"one of: {', '.join(VARIANTS)}" in help_text and "my_variant" in help_text, help_text


@pytest.mark.slow  # a process of its own
def test_fits_help_is_kept_by_its_key_and_the_shipped_text_is_the_parsers(tmp_path):
    """``fit --help`` took 7.5 s at load 1 (Lightning's imports, before any parsing; 256 s at load 20): the parser's
    text is kept in the cache under its key, and equals the text the package ships for these versions."""
    from sa_lightning.main import SHIPPED_HELP, _help_files

    env = {"SA_LIGHTNING_CACHE": str(tmp_path), "SA_LIGHTNING_HELP": "live", "COLUMNS": "80"}
    first = run_cli("fit", "--help", **env)
    assert first.returncode == 0 and "--model.arch" in first.stdout
    kept = tmp_path / "help" / "fit.txt"
    header, _, text = kept.read_text().partition("\n")
    assert text == first.stdout and "lit/module.py" in json.loads(header)["files"]
    shipped = Path(_help_files("fit")[0])
    assert shipped.parent.name == SHIPPED_HELP
    if _shipped_is_current("fit"):  # the key holds here: the shipped text is what the parser prints
        assert shipped.read_text().partition("\n")[2] == first.stdout
    kept.write_text(header + "\nthe kept text\n")  # the next help comes from the kept file, not from the parser
    assert run_cli("fit", "--help", SA_LIGHTNING_CACHE=str(tmp_path)).stdout == "the kept text\n"


def _shipped_is_current(name: str) -> bool:
    """The shipped ``name --help`` text's key holds in this environment, with the default cache folder."""
    from sa_lightning.main import _help_files, _help_key

    with pytest.MonkeyPatch.context() as monkey:
        monkey.delenv("SA_LIGHTNING_CACHE", raising=False)
        kept = json.loads(_help_files(name)[0].read_text().partition("\n")[0])
        return kept["key"] == _help_key(name, kept["files"])


def test_a_kept_help_is_served_only_while_its_key_holds(tmp_path, monkeypatch, capsys):
    """The key is the bytes of the files the parser imported and the versions: a changed or missing file, another
    version of a parser's library or another cache folder (the help shows it) makes the text stale."""
    from sa_lightning import main as cli_main

    monkeypatch.setenv("SA_LIGHTNING_CACHE", str(tmp_path))
    monkeypatch.delenv("SA_LIGHTNING_HELP", raising=False)
    monkeypatch.setattr(cli_main, "SHIPPED_HELP", "no-such-folder")
    path = tmp_path / "help" / "fit.txt"
    path.parent.mkdir()
    files = ["main.py", "utils/cache.py"]
    path.write_text(json.dumps({"key": cli_main._help_key("fit", files), "files": files}) + "\nkept\n")
    assert cli_main._print_cached_help("fit") and capsys.readouterr().out == "kept\n"
    monkeypatch.setenv("SA_LIGHTNING_HELP", "live")
    assert cli_main._kept_help("fit") is None
    monkeypatch.delenv("SA_LIGHTNING_HELP")
    monkeypatch.setenv("SA_LIGHTNING_CACHE", str(tmp_path / "elsewhere"))  # another default shown in the help
    assert cli_main._kept_help("fit") is None
    monkeypatch.setenv("SA_LIGHTNING_CACHE", str(tmp_path))
    assert cli_main._kept_help("fit") == "kept\n"
    monkeypatch.setattr(cli_main, "_help_versions", lambda: "lightning=0.0")  # another version
    assert cli_main._kept_help("fit") is None
    monkeypatch.undo()
    monkeypatch.setenv("SA_LIGHTNING_CACHE", str(tmp_path))
    monkeypatch.setattr(cli_main, "SHIPPED_HELP", "no-such-folder")
    key = cli_main._help_key("fit", files)
    path.write_text(json.dumps({"key": key, "files": [*files, "gone.py"]}) + "\nx\n")
    assert cli_main._kept_help("fit") is None and cli_main._help_key("fit", ["gone.py"]) is None


def test_shipped_help_is_current():
    """The help texts the package ships (``sa_lightning/help/``) still hold for the tested versions: a change to a
    file the CLI's parser imports makes them stale, and a fresh clone would wait for Lightning again."""
    import importlib.metadata as md

    from sa_lightning.main import CACHED_HELP

    lock = (Path(__file__).parent.parent / "docker" / "requirements.lock").read_text()
    tested = all(f"{p}=={md.version(p)}" in lock for p in ("lightning", "jsonargparse", "transformers"))
    if not tested or md.version("torch").split("+")[0] != "2.13.0" or sys.version_info[:2] != (3, 11):
        pytest.skip("the shipped help is made for the tested versions (README's install, Python 3.11)")
    stale = [name for name in CACHED_HELP if not _shipped_is_current(name)]
    assert not stale, f"shipped help stale for {stale}: run `python scripts/refresh_help.py` and commit it"


def test_a_new_file_in_the_package_or_a_registered_variant_makes_the_kept_help_stale(tmp_path, monkeypatch):
    """The help lists the variants by their files' names, which the parser never imports (the registry is lazy): a
    new variant file changes the key; a variant registered in this process is never served from a kept text."""
    from sa_lightning import main as cli_main
    from sa_lightning.attention.registry import VARIANTS

    root = tmp_path / "pkg"
    (root / "attention" / "variants").mkdir(parents=True)
    (root / "main.py").write_text("x = 1\n")
    monkeypatch.setattr(cli_main, "__file__", str(root / "main.py"))
    before = cli_main._help_key("fit", ["main.py"])
    (root / "attention" / "variants" / "mine.py").write_text("VARIANT = None\n")
    assert cli_main._help_key("fit", ["main.py"]) != before
    monkeypatch.undo()

    monkeypatch.setenv("SA_LIGHTNING_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("SA_LIGHTNING_HELP", raising=False)
    path = tmp_path / "cache" / "help" / "fit.txt"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"key": cli_main._help_key("fit", ["main.py"]), "files": ["main.py"]}) + "\nkept\n")
    assert cli_main._kept_help("fit") == "kept\n"
    monkeypatch.setitem(VARIANTS, "my_variant", VARIANTS["full"])
    assert cli_main._kept_help("fit") is None
