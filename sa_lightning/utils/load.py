"""A busy machine runs with one thread. Under load, torch's OpenMP threads spin waiting for each other and
lose their cores to other processes: measured on a shared 2-core machine, a tiny-model training step took 6x
longer in wall time with 2 threads than with 1, and a 40-step fit 11x (docs/benchmarks.md). ``OMP_NUM_THREADS``
is the setting; a user who sets it keeps their choice."""
from __future__ import annotations

import os

#: set by ``pick_threads`` when it chose one thread, so a later check knows the choice was not the user's
_AUTO = "SA_LIGHTNING_AUTO_THREADS"


def cores_available() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def is_busy(load: float | None = None, cores: int | None = None) -> tuple[bool, float, int]:
    """(busy, load, cores): busy when the 1-minute load average exceeds the cores this process may use."""
    try:
        load = os.getloadavg()[0] if load is None else load
    except OSError:  # no load average on this platform
        return False, 0.0, cores or 1
    cores = cores_available() if cores is None else cores
    return load > cores, load, cores


def user_chose_threads() -> bool:
    return bool(os.environ.get("OMP_NUM_THREADS")) and not os.environ.get(_AUTO)


def pick_threads(load: float | None = None, cores: int | None = None) -> str | None:
    """On a busy machine where the user chose no thread count: one thread from here on (this process and the
    ones it starts, through ``OMP_NUM_THREADS``), and the one line that says so; None otherwise."""
    if user_chose_threads():
        return None
    busy, load, cores = is_busy(load, cores)
    if not busy:
        return None
    os.environ["OMP_NUM_THREADS"] = "1"
    os.environ[_AUTO] = "1"
    import sys

    if "torch" in sys.modules:  # already imported: OMP_NUM_THREADS is read at import only
        sys.modules["torch"].set_num_threads(1)
    return (f"note: this machine is busy (load {load:.1f} on {cores} cores), so this runs with one thread "
            f"(torch's threads would wait on each other; set OMP_NUM_THREADS to choose another count), and each "
            f"stage, the imports first, may take about {max(2, round(load / cores))}x its idle time before its line.")
