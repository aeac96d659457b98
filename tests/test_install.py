"""The install commands a new user copies: the README's two set-up commands, CI and the CPU image install the
same CPU build of torch, and that command resolves no CUDA package."""
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def _torch_installs() -> dict[str, str]:
    """Every place that installs torch, and the command it uses."""
    found = {}
    for i, line in enumerate(re.findall(r"^python -m pip install torch.*$", (ROOT / "README.md").read_text(), re.M)):
        found[f"README set-up command {i + 1}"] = line.split(" && ")[0]
    for line in (ROOT / ".ci/run").read_text().splitlines():
        if "pip install torch" in line:
            found[".ci/run"] = line.split("#")[0].strip()
    for line in (ROOT / "docker/Dockerfile.cpu").read_text().splitlines():
        if "pip install torch" in line:
            found["docker/Dockerfile.cpu"] = line.removeprefix("RUN ").strip()
    return found


def test_readme_ci_and_the_cpu_image_install_the_cpu_build_of_the_pinned_torch():
    """From PyPI alone, torch==2.13.0 on Linux is the CUDA build (about 20 nvidia-* packages and triton): the
    pin alone keeps nothing off a CPU machine. Every install names PyTorch's CPU index."""
    installs = _torch_installs()
    assert {"README set-up command 1", "README set-up command 2", ".ci/run", "docker/Dockerfile.cpu"} <= set(installs)
    for where, command in installs.items():
        words = shlex.split(command)
        assert "torch==2.13.0" in words, (where, command)
        assert "--index-url" in words and words[words.index("--index-url") + 1] == CPU_INDEX, (where, command)


@pytest.mark.slow  # pip resolves the command (no download, no install)
def test_the_readme_torch_command_resolves_the_cpu_wheel_and_no_cuda_package(tmp_path):
    """The README's own torch step, as a dry run with this machine's pip configuration (what CI has). Where the
    CPU index cannot be reached (here: only the package registries are), pip finds the same CPU wheel in the
    machine's wheel folder; ``--retries 0`` only stops it from waiting on that unreachable host."""
    command = _torch_installs()["README set-up command 2"]
    args = shlex.split(command)[3:]  # after `python -m pip`
    report = tmp_path / "report.json"
    proc = subprocess.run([sys.executable, "-m", "pip", *args, "--dry-run", "--ignore-installed", "--retries", "0",
                           "--quiet", "--report", str(report)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    resolved = {item["metadata"]["name"].lower(): item["metadata"]["version"]
                for item in json.loads(report.read_text())["install"]}
    assert resolved["torch"] == "2.13.0+cpu", resolved
    assert not [name for name in resolved if name.startswith("nvidia") or name == "triton"], resolved


def test_readme_and_ci_install_the_locked_versions_and_the_newest_release_check_names_every_dependency():
    """The README's set-up commands and CI install the project with the lock as constraints (a fresh install is
    the tested set, not whatever is newest), and the README's newest-releases command upgrades every dependency
    of pyproject.toml but torch (which stays the CPU build installed first)."""
    import tomllib

    readme = (ROOT / "README.md").read_text()
    installs = [line.split(" && ")[1] for line in re.findall(r"^python -m pip install torch.*$", readme, re.M)]
    installs += [line.split("#")[0].strip() for line in (ROOT / ".ci/run").read_text().splitlines()
                 if "pip install -e" in line]
    assert len(installs) == 3, installs
    for command in installs:
        assert shlex.split(command)[3:] == ["install", "-e", ".[dev]", "-c", "docker/requirements.lock"], command
    (newest,) = re.findall(r"^python -m pip install -U .*$", readme, re.M)
    upgraded = {re.split(r"\[", word)[0] for word in shlex.split(newest.split(" && ")[0])[5:]}
    deps = {re.split(r"[<>=!\[; ]", spec)[0] for spec in tomllib.loads((ROOT / "pyproject.toml").read_text())
            ["project"]["dependencies"]}
    assert upgraded == deps - {"torch"}, (upgraded ^ (deps - {"torch"}))


def test_every_link_and_figure_in_the_docs_and_readme_resolves():
    """The docs became an index with a page per study (``docs/results/``); their figures stayed in ``docs/figures``
    and 34 image links pointed at ``docs/results/figures``, which does not exist. Every relative link resolves."""
    import re

    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    broken = [f"{page.relative_to(ROOT)}: {target}" for page in pages
              for target in re.findall(r"\]\(([^)#\s]+)", page.read_text())
              if not target.startswith(("http://", "https://", "mailto:")) and ("/" in target or "." in target)
              and not (page.parent / target).exists()]
    assert not broken, broken
