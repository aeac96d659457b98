"""A hint for a busy machine. Under load, torch's OpenMP threads spin waiting for each other and lose their
cores to other processes: measured on a shared 2-core machine, a tiny-model training step took 6x longer in
wall time with 2 threads than with 1 (docs/benchmarks.md). ``OMP_NUM_THREADS`` is the setting."""
from __future__ import annotations

import os


def busy_hint(load: float | None = None, cores: int | None = None, threads: str | None = None) -> str | None:
    """One line advising ``OMP_NUM_THREADS=1`` when the 1-minute load average exceeds the cores available to
    this process and the user has not chosen a thread count; None otherwise."""
    threads = os.environ.get("OMP_NUM_THREADS") if threads is None else threads
    if threads:
        return None
    try:
        load = os.getloadavg()[0] if load is None else load
    except OSError:  # no load average on this platform
        return None
    if cores is None:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    if load <= cores:
        return None
    return (f"note: this machine is busy (load {load:.1f} on {cores} cores); torch's threads then wait on each "
            f"other, and OMP_NUM_THREADS=1 before the command can make a CPU run several times faster.")
