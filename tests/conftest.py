import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
# one token cache per test session, shared by in-process and subprocess runs, away from ~/.cache
import tempfile  # noqa: E402

os.environ.setdefault("SA_LIGHTNING_CACHE", tempfile.mkdtemp(prefix="sa_lightning_cache_"))

if os.environ.get("PYTEST_XDIST_WORKER"):  # pytest -n N: one thread per worker, its subprocesses included, so
    os.environ["OMP_NUM_THREADS"] = "1"  # that N workers do not oversubscribe the cores (OpenMP's spinning
    # threads then slow small ops tenfold)

import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(1 if os.environ.get("PYTEST_XDIST_WORKER") else min(2, torch.get_num_threads()))


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
