"""Peak tensor memory of a callable: the CUDA allocator's peak, or the profiler's CPU timeline."""
from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
from typing import Callable, Iterator

import torch

#: what the CPU profiler itself writes to the process's stderr (fd 2, from C++) on every start and stop:
#: Kineto's ``USDT:/STAGE: ... SyncActivityProfilerHandler.cpp:52] profiler_start`` lines and c10's warning
#: that a block allocated before the profile started has no free event (which ``peak_bytes`` expects)
PROFILER_CHATTER = re.compile(r"Profiler\w*\.cpp:\d+\]|allocated before the profiling started")


def peak_bytes(fn: Callable[[], object], device: torch.device) -> int:
    """Peak bytes allocated by tensors while ``fn`` runs, above what was live before it."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
        fn()
        torch.cuda.synchronize(device)
        return torch.cuda.max_memory_allocated(device) - base
    from torch.profiler import ProfilerActivity, profile

    with quiet_profiler(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    # Allocations made inside an op are its "self" memory; frees outside any op are [memory] events.
    deltas = sorted(
        (e.time_range.start, e.cpu_memory_usage if e.name == "[memory]" else e.self_cpu_memory_usage)
        for e in prof.events()
    )
    current = peak = 0
    for _, delta in deltas:
        current += delta
        peak = max(peak, current)
    return peak


@contextlib.contextmanager
def quiet_profiler() -> Iterator[None]:
    """Hold back the profiler's own lines (``PROFILER_CHATTER``), which C++ writes straight to file
    descriptor 2, where no Python filter reaches: fd 2 goes to a temporary file while the block runs, then
    every other line in it (an error, a warning of the code under measurement) is written to stderr."""
    sys.stderr.flush()
    try:
        saved = os.dup(2)
    except OSError:  # no fd 2 to redirect (a closed stderr): nothing to hold back either
        yield
        return
    with tempfile.TemporaryFile(mode="w+b") as held:
        os.dup2(held.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            held.seek(0)
            kept = [line for line in held.read().decode(errors="replace").splitlines(keepends=True)
                    if not PROFILER_CHATTER.search(line)]
            if kept:
                sys.stderr.write("".join(kept))
                sys.stderr.flush()
