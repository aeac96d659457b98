#!/usr/bin/env python
"""sa_lightning command line.

    python cli.py bench attention [--preset cpu|paper] ...   latency and memory of every variant
    python cli.py analyze coverage|connection|variance|all   checks of the paper's theory
"""
from __future__ import annotations

import sys

USAGE = __doc__


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return
    command, rest = argv[0], argv[1:]
    if command in ("bench", "analyze"):
        from sa_lightning.utils.cpu_allocator import tune_cpu_allocator

        tune_cpu_allocator()
    if command == "bench":
        if not rest or rest[0] != "attention":
            raise SystemExit("error: 'bench' takes one benchmark: attention. Example: python cli.py bench attention")
        from sa_lightning.bench.attention import main as bench_main

        bench_main(rest[1:])
    elif command == "analyze":
        from sa_lightning.analysis.report import main as analyze_main

        analyze_main(rest)
    else:
        raise SystemExit(f"error: unknown command {command!r}; expected bench or analyze.\n{USAGE}")


if __name__ == "__main__":
    main()
