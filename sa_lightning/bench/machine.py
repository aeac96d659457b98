"""A one-line description of the machine a benchmark ran on."""
from __future__ import annotations

import torch

from ..utils import host
from ..utils.argtypes import positive_int  # noqa: F401  (the benchmarks' argparse type)


def sync(device: torch.device) -> None:
    """Wait for queued GPU work, so that a timer measures it."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def apply_preset(args, presets: dict) -> None:
    """Fill each argument left unset (None) from ``args.preset``'s values, and refuse in one line a preset for a
    CUDA GPU where there is none (``bench train``, ``bench profile``)."""
    for key, value in presets[args.preset].items():
        if getattr(args, key, None) is None:
            setattr(args, key, value)
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit(f"error: --preset {args.preset} needs a CUDA GPU; use --preset cpu on this machine.")


def describe(device: torch.device | str = "cpu") -> str:
    device = torch.device(device)
    if device.type == "cuda":
        return f"{torch.cuda.get_device_name(device)}, torch {torch.__version__}"
    return f"{host.cpu_name()}, {torch.get_num_threads()} threads, torch {torch.__version__}"


def peak_flops(device: torch.device | str, dtype: torch.dtype) -> float | None:
    """The device's peak dense FLOP/s for ``dtype`` from Lightning's table, or None where it is unknown (CPUs).

    Lightning matches an H200 only by its SXM1/NVL1 names, and lists the datasheet's with-sparsity figures for
    it; an H200 SXM has the H100 SXM's tensor cores and clocks (989 dense bf16 TFLOP/s), so it reads that entry.
    """
    device = torch.device(device)
    if device.type != "cuda":  # Lightning's table knows no CPU peak; importing it would cost seconds for None
        return None
    from lightning.fabric.utilities import throughput

    flops = throughput.get_available_flops(device, dtype)
    if device.type == "cuda" and "h200" in torch.cuda.get_device_name(device).lower():
        hopper = getattr(throughput, "_CUDA_FLOPS", {}).get("h100 sxm", {})
        flops = hopper.get(dtype, flops)
    return float(flops) if flops else None


def available_bytes(device: torch.device | str) -> int | None:
    """Free memory on ``device``: the GPU's free bytes, or the CPU's MemAvailable; None where unknown."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        with open("/proc/meminfo") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:"))
    except (OSError, StopIteration, ValueError):
        return None
