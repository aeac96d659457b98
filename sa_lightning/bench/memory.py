"""Peak tensor memory of a callable: the CUDA allocator's peak, or the profiler's CPU timeline."""
from __future__ import annotations

from typing import Callable

import torch

from ..utils.quiet import quiet_profiler  # noqa: F401  (its home; the benchmarks import it from here)


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
