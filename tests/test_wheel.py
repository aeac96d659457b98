"""Works from a wheel (issue 34): the wheel carries everything a command reads at run time, and an install of
it outside the checkout runs ``sa-lightning --help``, every command's ``--help``, ``submit`` (its SLURM
templates) and a few steps of ``fit`` on a copy of ``configs/tiny.yaml``. Importing sa_lightning changes
nothing in the process."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _package_files() -> list[str]:
    """The package's files as git sees them (tracked, or new and not ignored): what a commit would ship."""
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z", "sa_lightning"],
                            cwd=ROOT, capture_output=True, text=True, check=True).stdout.split("\0")
    return sorted(f for f in listed if f and "__pycache__" not in f and (ROOT / f).is_file())


def _clean_env(venv: Path, **extra) -> dict:
    """This environment with the venv first on PATH and nothing pointing at the checkout."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    return {**env, "PATH": f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}", "HF_HUB_OFFLINE": "1",
            "HF_DATASETS_OFFLINE": "1", "PYTHONNOUSERSITE": "1", **extra}


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """The wheel, built from a copy of the package's files (so nothing is written into the checkout) and
    installed with ``--no-deps`` into a fresh venv. That venv sees this environment's site-packages through a
    ``.pth`` line, which puts the dependencies on ``sys.path`` without running that folder's own ``.pth`` files:
    the editable install of the checkout is not active there."""
    tmp = tmp_path_factory.mktemp("wheel")
    src, dist, venv, run = tmp / "src", tmp / "dist", tmp / "venv", tmp / "run"
    for name in [*_package_files(), "pyproject.toml", "README.md"]:
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, src / name)
    pip = [sys.executable, "-m", "pip"]
    done = subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q", "-w", str(dist),
                           str(src)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (wheel,) = dist.glob("sa_lightning-*.whl")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    site = Path(subprocess.run([str(venv / "bin/python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    deps = dict.fromkeys([sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]])
    (site / "_sa_lightning_test_deps.pth").write_text("".join(f"{p}\n" for p in deps))
    done = subprocess.run([*pip, "--python", str(venv / "bin/python"), "install", "--no-deps", "--no-index", "-q",
                           str(wheel)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    run.mkdir()
    return {"wheel": wheel, "venv": venv, "site": site, "run": run}


def _run(installed, *args, timeout=240, **env) -> subprocess.CompletedProcess:
    return subprocess.run([str(a) for a in args], cwd=installed["run"], env=_clean_env(installed["venv"], **env),
                          capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)


@pytest.mark.slow  # builds a wheel and starts fresh interpreters
@pytest.mark.xdist_group("wheel")  # one wheel for both tests that install it (pytest -n 2 --dist loadgroup)
def test_the_wheel_ships_every_file_of_the_package_and_the_command(installed):
    """Every file under sa_lightning/ (code, the embedded corpus and tokenizer, the offline lm-eval tasks, the
    SLURM templates) is in the wheel, nothing outside the package is, and it declares ``sa-lightning``."""
    wheel = zipfile.ZipFile(installed["wheel"])
    names = [n for n in wheel.namelist() if ".dist-info/" not in n]
    (entry_points,) = [wheel.read(n).decode() for n in wheel.namelist() if n.endswith(".dist-info/entry_points.txt")]
    assert sorted(names) == _package_files()
    assert "sa-lightning = sa_lightning.main:main_with_clean_errors" in entry_points


# every command's --help in one interpreter of the installed copy, each as the console script runs it
# (``main_with_clean_errors`` with ``sys.argv`` set), then ``submit --dry_run``: one import of Lightning and
# transformers for all of them
HELP_ALL = r'''
import contextlib, io, json, sys, traceback
from sa_lightning.main import COMMANDS, Group, main_with_clean_errors

results = {}
for name, entry in COMMANDS.items():
    for words in ([[name, sub] for sub in entry.commands] if isinstance(entry, Group) else [[name]]):
        sys.argv, out, code = ["sa-lightning", *words, "--help"], io.StringIO(), 0
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            try:
                main_with_clean_errors()
            except SystemExit as stop:
                code = 0 if stop.code is None else stop.code
            except BaseException:
                code = traceback.format_exc()
        results[" ".join(words)] = [code, out.getvalue()]
from sa_lightning import doctor
results["doctor.ROOT"] = [0, repr(doctor.ROOT)]
# submit, in the same interpreter: the templates come from the package, and the job runs the installed module
sys.argv, out = ["sa-lightning", "submit", "pretrain", "--config", "tiny.yaml", "--dry_run"], io.StringIO()
with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
    try:
        main_with_clean_errors()
        code = 0
    except SystemExit as stop:
        code = 0 if stop.code is None else stop.code
results["submit --dry_run"] = [code, out.getvalue()]
with open("help.json", "w") as fh:
    json.dump(results, fh)
'''


@pytest.mark.slow  # builds a wheel, installs it, and trains 3 steps from it
@pytest.mark.xdist_group("wheel")
def test_an_installed_wheel_runs_outside_the_checkout(installed):
    run, venv, site = installed["run"], installed["venv"], installed["site"]
    where = _run(installed, venv / "bin/python", "-c", "import sa_lightning; print(sa_lightning.__file__)")
    assert where.returncode == 0, where.stderr[-3000:]
    assert Path(where.stdout.strip()).is_relative_to(site), where.stdout  # the wheel's copy, not the checkout

    usage = _run(installed, venv / "bin/sa-lightning", "--help")
    assert usage.returncode == 0 and "sa-lightning" in usage.stdout, usage.stdout + usage.stderr
    as_module = _run(installed, venv / "bin/python", "-m", "sa_lightning.main", "--help")  # what a SLURM job runs
    assert as_module.returncode == 0 and as_module.stdout == usage.stdout, as_module.stdout + as_module.stderr

    (run / "tiny.yaml").write_text((ROOT / "configs/tiny.yaml").read_text())  # for submit
    helps = _run(installed, venv / "bin/python", "-c", HELP_ALL)
    assert helps.returncode == 0, helps.stdout[-3000:] + helps.stderr[-3000:]
    results = json.loads((run / "help.json").read_text())
    from sa_lightning.main import COMMANDS, Group

    expected = {f"{name} {sub}" for name, entry in COMMANDS.items() if isinstance(entry, Group) for sub in entry.commands}
    expected |= {name for name, entry in COMMANDS.items() if not isinstance(entry, Group)}
    assert expected <= set(results)
    failed = {words: result for words, result in results.items() if words in expected
              and (result[0] != 0 or "usage" not in result[1].lower())}
    assert not failed, json.dumps(failed, indent=1)[-6000:]
    assert results["doctor.ROOT"][1] == "None"  # installed: doctor's tests stage says it skips tests/

    # submit: the templates come from the package, and the job runs the installed module (there is no cli.py)
    code, printed = results["submit --dry_run"]
    assert code == 0, printed[-3000:]
    assert "srun python -m sa_lightning.main fit --config tiny.yaml" in printed, printed

    # fit: a copy of configs/tiny.yaml, made small by tests/configs/fast.yaml (copied too), for 3 steps
    (run / "fast.yaml").write_text((ROOT / "tests/configs/fast.yaml").read_text())
    fit = _run(installed, venv / "bin/sa-lightning", "fit", "--config", "tiny.yaml", "--config", "fast.yaml",
               "--trainer.max_steps", "3", "--trainer.val_check_interval", "3", "--trainer.default_root_dir", "out")
    both = fit.stdout + fit.stderr
    assert fit.returncode == 0, both[-4000:]
    assert "`Trainer.fit` stopped: `max_steps=3` reached." in both, both[-4000:]
    assert list((run / "out").rglob("*.ckpt")), both[-4000:]


# imported after the third-party packages, so that only sa_lightning's own effects are seen
IMPORT_EFFECTS = r'''
import importlib, logging, os, pkgutil, sys, warnings
import torch, datasets, lightning, transformers, torchdata.stateful_dataloader, matplotlib
import lm_eval.api.registry, lm_eval.models.huggingface  # these set warnings filters of their own

def state():
    loggers = {name: (len(getattr(l, "filters", [])), len(getattr(l, "handlers", [])), getattr(l, "level", None))
               for name, l in logging.root.manager.loggerDict.items()}
    loggers["root"] = (len(logging.root.filters), len(logging.root.handlers), logging.root.level)
    return {"meta_path": [repr(f) for f in sys.meta_path], "path_hooks": len(sys.path_hooks), "sys.path": list(sys.path),
            "warnings": len(warnings.filters), "environ": dict(os.environ), "threads": torch.get_num_threads(),
            "dtype": str(torch.get_default_dtype()), "loggers": loggers,
            "matplotlib": matplotlib.get_backend() if "matplotlib.pyplot" in sys.modules else None}

before = state()
import sa_lightning
skip = ("sa_lightning.eval.tasks",)  # lm-eval task code, loaded by path
for info in pkgutil.walk_packages(sa_lightning.__path__, "sa_lightning."):
    if not info.name.startswith(skip):
        importlib.import_module(info.name)
after = state()
changed = {k: (before[k], after[k]) for k in before if k != "loggers" and before[k] != after[k]}
changed.update({f"logger {n}": (before["loggers"].get(n), v) for n, v in after["loggers"].items()
                if before["loggers"].get(n, (0, v[1], v[2])) != v})  # a logger new here: its filters only
print(repr(changed))
'''


@pytest.mark.slow  # a fresh interpreter imports every module
def test_importing_sa_lightning_changes_nothing_in_the_process():
    """No import hook, no warnings or logging filter, no environment variable, thread count or default dtype is
    set by importing any sa_lightning module: the command line and the code paths that need them set them."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-c", IMPORT_EFFECTS], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "{}", done.stdout[-3000:]


def test_importing_the_package_alone_imports_nothing_heavy():
    """``import sa_lightning`` (what the console script does first) installs no hook and imports no transformers;
    ``register_with_transformers`` is what registers the exported model's classes."""
    code = ("import sys; hooks = list(sys.meta_path); import sa_lightning; "
            "print(sys.meta_path == hooks, 'transformers' in sys.modules, 'torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                          capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout.split() == ["True", "False", "False"]
