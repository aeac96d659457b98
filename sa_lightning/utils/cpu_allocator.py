"""Keep freed CPU tensor memory in glibc's heap instead of returning it to the OS.

Attention scores are tens of MB per layer. With glibc's defaults every such buffer is a fresh
``mmap`` whose pages fault in on first touch, which costs more than the matmuls on a small CPU.
Raising the mmap and trim thresholds makes malloc recycle those pages. It is what tcmalloc or
jemalloc would do, without a preload. Opt out with ``SA_LIGHTNING_DEFAULT_MALLOC=1``.

It is a setting of the whole process, so no import applies it: the command line (``main.py``, every
command) and the doctor's stage processes call ``tune_cpu_allocator()``; a notebook or a script of your own
calls it once for the same kernel speed.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys

_M_TRIM_THRESHOLD, _M_TOP_PAD, _M_MMAP_THRESHOLD = -1, -2, -3


def tune_cpu_allocator(mmap_threshold: int = 1 << 30, top_pad: int = 256 << 20) -> bool:
    """Apply the thresholds through ``mallopt``; return whether glibc accepted them (idempotent)."""
    if os.environ.get("SA_LIGHTNING_DEFAULT_MALLOC") == "1" or not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    ok = mallopt(_M_MMAP_THRESHOLD, mmap_threshold)
    ok &= mallopt(_M_TRIM_THRESHOLD, 2 * mmap_threshold)
    ok &= mallopt(_M_TOP_PAD, top_pad)
    return bool(ok)
