import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
# one token cache per test process (each xdist worker has its own), shared with the runs it starts, and never
# the user's: an exported SA_LIGHTNING_CACHE (a shared cluster cache, say) is replaced for the session, and the
# folder is removed when the session ends
import atexit  # noqa: E402
import shutil  # noqa: E402
import tempfile  # noqa: E402

_CACHE = tempfile.mkdtemp(prefix="sa_lightning_cache_")
os.environ["SA_LIGHTNING_CACHE"] = _CACHE
atexit.register(shutil.rmtree, _CACHE, ignore_errors=True)

if os.environ.get("PYTEST_XDIST_WORKER"):  # pytest -n N: one thread per worker, its subprocesses included, so
    os.environ["OMP_NUM_THREADS"] = "1"  # that N workers do not oversubscribe the cores (OpenMP's spinning
    # threads then slow small ops tenfold)

import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(1 if os.environ.get("PYTEST_XDIST_WORKER") else min(2, torch.get_num_threads()))


#: the modules that take longest (their tests' seconds summed, 2026-11-27), started first: pytest -n 2 hands out
#: tests in collection order, so a long module met last (the wheel's group, which one worker runs alone) left the
#: other worker idle at the end. Whole modules move, so no module fixture is built twice; the rest keep their order.
FIRST = ("test_faults.py", "test_wheel.py", "test_doctor.py", "test_cluster.py", "test_training.py",
         "test_hf_model.py", "test_synthetic.py", "test_smollm2_cache.py", "test_real_model.py", "test_gpu_risks.py",
         "test_eval.py", "test_inference.py", "test_sweep_reuse.py", "test_fit_output.py", "test_resume.py")


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(FIRST)))  # stable: each module's order is kept
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
