"""The machine a result came from: its CPU (or GPU), its torch build and its thread count. A cell record carries it,
since a single training seed's value does not carry across CPUs (floating-point reductions differ), while the
statistics over seeds do."""
from __future__ import annotations

import functools
import platform

import torch


@functools.lru_cache(maxsize=1)
def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def machine(device: torch.device | str = "cpu", threads: int | None = None) -> dict:
    """{cpu, gpu, torch, threads}: what made a result, for its record."""
    device = torch.device(device)
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else None
    return {"cpu": cpu_name(), "gpu": gpu, "torch": torch.__version__,
            "threads": int(threads if threads is not None else torch.get_num_threads())}


def describe(info: dict) -> str:
    """One line: the GPU or the CPU, the threads, the torch build."""
    where = info.get("gpu") or f"{info.get('cpu', '?')}, {info.get('threads', '?')} threads"
    return f"{where}, torch {info.get('torch', '?')}"


def same_machine(a: dict | None, b: dict | None) -> bool:
    """Two records made on the same kind of machine (CPU or GPU model and torch build; threads aside)."""
    keys = ("cpu", "gpu", "torch")
    return bool(a) and bool(b) and all(a.get(k) == b.get(k) for k in keys)
