"""Kernel speed from plain Python: the attention benchmark imported as a library, with nothing of cli.py.

    python scripts/kernel_speed_from_python.py            # the issue-17 setting: B=1, H=4, d=64, w=256, fp32
    SA_LIGHTNING_DEFAULT_MALLOC=1 python scripts/kernel_speed_from_python.py   # glibc's defaults, to compare

Tunes malloc as the command line does (``tune_cpu_allocator``: importing sa_lightning never does), then runs
``sa_lightning.bench.attention`` in this process (its own ``--same-process`` timing: forward+backward,
variants interleaved within each repeat, sigma and sigma^-1 drawn outside the clock) for full SDPA, SWA, SA
and gated SA+SWA at n = 2k, 8k and 16k, then prints the ratios that docs/benchmarks.md records:
SA t(16k)/t(2k), full/SA at 16k, SA/SWA at 8k and SA+SWA/SWA at 8k.
"""
from __future__ import annotations

import sys

from sa_lightning.bench.attention import main as bench_attention


def ratios(rows: list[dict]) -> dict[str, float]:
    ms = {(r["n"], r["variant"]): r["ms"] for r in rows}
    return {
        "SA t(16k)/t(2k)": ms[(16384, "sa")] / ms[(2048, "sa")],
        "full/SA at 16k": ms[(16384, "full")] / ms[(16384, "sa")],
        "SA/SWA at 8k": ms[(8192, "sa")] / ms[(8192, "swa")],
        "SA+SWA/SWA at 8k": ms[(8192, "sa_swa")] / ms[(8192, "swa")],
    }


def main(argv: list[str] | None = None) -> dict[str, float]:
    rows = bench_attention(["--same-process", "--no-memory", "--lengths", "2048", "8192", "16384",
                            "--variants", "full", "swa", "sa", "sa_swa", "--repeats", "5",
                            "--out", "outputs/bench/from_python", *(sys.argv[1:] if argv is None else argv)])
    found = ratios(rows)
    for name, value in found.items():
        print(f"{name}: {value:.2f}")
    return found


if __name__ == "__main__":
    from sa_lightning.utils.cpu_allocator import tune_cpu_allocator

    tune_cpu_allocator()  # what cli.py does; SA_LIGHTNING_DEFAULT_MALLOC=1 keeps glibc's defaults
    main()
