"""The layer contract (docs/ARCHITECTURE.md) that pyproject.toml gives import-linter: kept by the code, and
able to catch a lower layer importing a higher one."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

ROOT = Path(__file__).resolve().parents[1]
LINT = shutil.which("lint-imports") or str(Path(sys.executable).with_name("lint-imports"))


def _lint(root: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run([LINT, "--config", str(root / "pyproject.toml"), "--no-cache"], cwd=root, env=env,
                          capture_output=True, text=True, timeout=120)


def test_every_package_has_a_layer_and_the_code_keeps_them():  # in the quick tier: a few seconds, one process
    contract = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"][0]
    assert contract["exhaustive"] and contract["containers"] == ["sa_lightning"]
    named = {name.strip() for layer in contract["layers"] for name in layer.split("|")}
    assert named == {"main", "doctor", "cluster", "migrate", "bench", "experiments", "lit", "inference", "eval",
                     "analysis", "models", "attention", "data", "utils"}
    proc = _lint(ROOT)
    assert proc.returncode == 0 and "1 kept, 0 broken" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-2000:]


@pytest.mark.slow
@pytest.mark.parametrize("module, line", [
    ("models/flops.py", "from ..lit import cli"),  # a lower layer importing a higher one, even lazily
    ("eval/offline.py", "from ..analysis import analyze"),  # two independent siblings
])
def test_the_contract_catches_an_import_that_breaks_a_layer(module, line, tmp_path):
    shutil.copytree(ROOT / "sa_lightning", tmp_path / "sa_lightning",
                    ignore=shutil.ignore_patterns("__pycache__", "embedded", "tasks"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    target = tmp_path / "sa_lightning" / module
    target.write_text(target.read_text() + f"\n\ndef _breaks_the_layers():\n    {line}\n")
    proc = _lint(tmp_path)
    assert proc.returncode != 0 and "BROKEN" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-2000:]
