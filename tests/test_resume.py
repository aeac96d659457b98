"""What a user's command may change on resume, weights-only starts, one-flag output folders, the installed
command and a missing GPU: each through the shipped configs/tiny.yaml reduced in size only."""
import importlib.metadata
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from sa_lightning.lit.cli import run
from tests.helpers import run_cli, run_cli_here

ROOT = Path(__file__).resolve().parents[1]
BASE = ["--config", str(ROOT / "configs/tiny.yaml"), "--config", str(ROOT / "tests/configs/small.yaml")]
QUIET = ["--trainer.enable_progress_bar", "false"]
# appended where a run's attention maps and zero-shot tasks are not what the test looks at (tests/helpers.py)
LEAN = ['--trainer.callbacks+={"class_path": "tests.helpers.SkipUnusedWork"}']


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A 2-step run of the shipped config (sa_swa, window 16, d_model 64): its folder and last.ckpt."""
    root = tmp_path_factory.mktemp("trained")
    run(["fit", *BASE, *QUIET, *LEAN, "--trainer.max_steps", "2", "--trainer.default_root_dir", str(root)])
    last = root / "tb" / "version_0" / "checkpoints" / "last.ckpt"
    assert last.is_file()
    return root, last


@pytest.mark.slow
@pytest.mark.parametrize("flag, value, saved", [("arch.attention.variant", "full", "'sa_swa'"), ("arch.attention.window", "32", "16"),
                                                ("arch.d_model", "128", "64")])
def test_a_model_setting_that_differs_from_the_checkpoint_is_refused_not_dropped(flag, value, saved, trained, tmp_path):
    root, last = trained
    with pytest.raises(ValueError) as err:
        run(["fit", *BASE, *QUIET, f"--model.{flag}", value, "--ckpt_path", str(last),
             "--trainer.max_steps", "3", "--trainer.default_root_dir", str(tmp_path)])
    message = str(err.value)
    shown = repr(value) if flag == "arch.attention.variant" else value
    assert f"this command sets model.{flag}={shown}" in message and f"trained with model.{flag}={saved}" in message
    assert "drop --ckpt_path" in message and f"--model.init_weights {last}" in message
    assert not (tmp_path / "tb").exists()  # nothing ran


@pytest.mark.slow
def test_the_refusal_is_one_line_and_covers_settings_from_a_config_file(trained, tmp_path):
    root, last = trained
    proc = run_cli_here("fit", *BASE, *QUIET, "--model", str(ROOT / "configs/model/swa.yaml"), "--ckpt_path", str(last),
                        "--trainer.default_root_dir", str(tmp_path))
    line = proc.stderr.strip().splitlines()[-1]
    assert proc.returncode != 0 and line.startswith("error: this command sets model.arch.attention.variant='swa'"), proc.stderr[-2000:]


@pytest.mark.slow
def test_resume_keeps_the_checkpoint_model_and_honours_evaluation_only_settings(trained, tmp_path):
    """No conflicting key: the checkpoint's hyperparameters stand; eval_samples (how validation averages over
    permutations) is the user's, since it changes neither the weights nor the optimizer."""
    root, last = trained
    cli = run(["validate", *BASE, *QUIET, "--ckpt_path", "last", "--model.eval_samples", "3",
               "--trainer.default_root_dir", str(root)])
    assert cli.config.validate.ckpt_path == str(last)
    assert cli.model.hparams.eval_samples == 3 and cli.model.arch.attention.window == 16 and cli.model.arch.attention.variant == "sa_swa"


@pytest.mark.slow
def test_init_weights_starts_a_new_run_from_a_checkpoints_weights(trained, tmp_path):
    root, last = trained
    saved = torch.load(last, weights_only=True)["state_dict"]
    start = ["--model.init_weights", str(last), "--model.arch.attention.window", "32", "--trainer.default_root_dir", str(tmp_path)]
    cli = run([*BASE, *QUIET, *start], run=False)
    loaded = cli.model.state_dict()
    assert all(torch.equal(loaded[k], v) for k, v in saved.items() if k.startswith("net."))
    assert cli.model.arch.attention.window == 32
    first = run(["fit", *BASE, *QUIET, *LEAN, *start, "--trainer.max_steps", "1"])
    assert first.trainer.global_step == 1 and first.model.micro_step == 1  # a new run: from step 0
    # its resume (the same command, as a requeued job repeats it) needs no init file: the checkpoint has the weights
    again = run(["fit", *BASE, *QUIET, *LEAN, *start, "--ckpt_path", "last", "--trainer.max_steps", "2"])
    assert again.model.hparams.init_weights is None and again.trainer.global_step == 2


@pytest.mark.slow
@pytest.mark.parametrize("flag, value, needle", [
    ("arch.d_model", "128", "does not fit this model: embed.weight is (4096, 64) in the checkpoint and (4096, 128) here"),
    ("arch.attention.variant", "swa", "does not fit this model: blocks.0.attn.gate.gates.attn.weight is missing there; blocks.0.attn.gate.gates.sa.weight has no place here"),
])
def test_init_weights_refuses_a_model_that_does_not_fit(flag, value, needle, trained, tmp_path):
    root, last = trained
    proc = run_cli_here("fit", *BASE, *QUIET, "--model.init_weights", str(last), f"--model.{flag}", value,
                        "--trainer.default_root_dir", str(tmp_path))
    line = proc.stderr.strip().splitlines()[-1]
    assert proc.returncode != 0 and line.startswith("error: model.init_weights") and needle in line, proc.stderr[-2000:]


@pytest.mark.slow
def test_default_root_dir_alone_moves_logs_checkpoints_eval_tables_and_maps(tmp_path, monkeypatch):
    """Run from an empty working directory: everything lands under --trainer.default_root_dir, nothing beside it
    (both commands in this process, started in that directory)."""
    cwd, out = tmp_path / "cwd", tmp_path / "cwd" / "elsewhere"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    fit = run_cli_here("fit", *BASE, *QUIET, "--trainer.default_root_dir", "elsewhere")
    assert fit.returncode == 0, fit.stderr[-3000:]
    test = run_cli_here("test", *BASE, *QUIET, "--trainer.default_root_dir", "elsewhere", "--ckpt_path", "last",
                        "--trainer.callbacks.init_args.test_limit", "8")  # ZeroShotEval, last in the list
    assert test.returncode == 0, test.stderr[-3000:]
    assert sorted(p.name for p in cwd.iterdir()) == ["elsewhere"]
    files = {p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()}
    assert {"tb/version_0/checkpoints/last.ckpt", "tb/version_0/attention_maps/step6.png"} <= files
    assert any(f.startswith("tb/version_0/events.out.tfevents") for f in files)
    assert any(f.startswith("tb/version_1/") and f.endswith(".md") for f in files), files  # the test's eval table


@pytest.mark.slow
def test_the_installed_command_is_cli_py():
    (script,) = [ep for ep in importlib.metadata.entry_points(group="console_scripts") if ep.name == "sa-lightning"]
    assert script.value == "sa_lightning.main:main_with_clean_errors"
    exe = shutil.which("sa-lightning") or str(Path(sys.executable).parent / "sa-lightning")
    for args in (["--help"], ["bench", "nothing"], ["study", "long-range", "--preset", "nope"]):
        ours = subprocess.run([exe, *args], cwd=ROOT, capture_output=True, text=True, timeout=120)
        theirs = run_cli(*args)
        # a traceback here that cannot import sa_lightning means the installed command belongs to another
        # checkout (or a deleted one): run `pip install -e .` in this one
        assert (ours.returncode, ours.stdout) == (theirs.returncode, theirs.stdout), ours.stderr[-1500:]
        assert ours.stderr.strip().splitlines()[-1:] == theirs.stderr.strip().splitlines()[-1:]


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
@pytest.mark.parametrize("trainer", [[], ["--trainer", str(ROOT / "configs/trainer/ddp_4gpu.yaml")]])
def test_a_gpu_accelerator_without_a_gpu_is_one_line(trainer, tmp_path):
    proc = run_cli_here("fit", *BASE, *trainer, "--trainer.accelerator", "gpu", "--trainer.default_root_dir",
                        str(tmp_path))
    line = proc.stderr.strip().splitlines()[-1]
    assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert line.startswith("error: trainer.accelerator is 'gpu' but this machine has no CUDA GPU") and \
        "--trainer.accelerator cpu" in line


def test_a_second_fit_in_a_run_folder_says_it_starts_a_new_run_and_how_to_continue(tmp_path):
    from sa_lightning.lit.cli import earlier_run_line

    assert earlier_run_line([str(tmp_path)]) is None  # a new folder: nothing to say
    ckpt = tmp_path / "tb" / "version_0" / "checkpoints" / "last.ckpt"
    ckpt.parent.mkdir(parents=True)
    ckpt.write_bytes(b"x")
    line = earlier_run_line([str(tmp_path)])
    assert str(ckpt) in line and "new run" in line and "--ckpt_path last" in line
