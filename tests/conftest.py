import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
# one token cache per test session, shared by its xdist workers and the runs they start (its writers rename
# finished folders into place, as on a cluster's shared cache), and never the user's: an exported
# SA_LIGHTNING_CACHE (a shared cluster cache, say) is replaced for the session, and the process that made the
# folder (pytest's main process, which outlives its workers) removes it when the session ends
import atexit  # noqa: E402
import shutil  # noqa: E402
import tempfile  # noqa: E402

_SESSION = "SA_LIGHTNING_TEST_SESSION_CACHE"
if os.environ.get("PYTEST_XDIST_WORKER") and os.path.isdir(os.environ.get(_SESSION, "")):
    _CACHE = os.environ[_SESSION]  # a worker: the main process's folder
else:
    _CACHE = tempfile.mkdtemp(prefix="sa_lightning_cache_")
    os.environ[_SESSION] = _CACHE
    atexit.register(shutil.rmtree, _CACHE, ignore_errors=True)
os.environ["SA_LIGHTNING_CACHE"] = _CACHE

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
    if config.getoption("markexpr") != "gpu":  # `-m gpu` (the doctor) keeps its files' order: its first matter most
        items.sort(key=lambda item: rank.get(item.path.name, len(FIRST)))  # stable: each module's order is kept
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True, scope="session")
def _torch_env_report_once():
    """``lm_eval.simple_evaluate`` ends every call by asking torch's ``collect_env`` for a report of the machine
    (``pip list`` and other probes in subprocesses: 0.6-1.2 s a call on the 2-core machine) and stores it in a
    results field this project never reads; the suite makes many such calls, so in this process the
    report is taken once and reused. Runs in processes of their own (the CLI tests) take it as users do."""
    import functools

    from torch.utils import collect_env

    patch = pytest.MonkeyPatch()
    patch.setattr(collect_env, "get_pretty_env_info", functools.cache(collect_env.get_pretty_env_info))
    yield
    patch.undo()
