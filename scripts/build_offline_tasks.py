#!/usr/bin/env python
"""Rebuild the offline lm-eval tasks' data from the held-out plays of the embedded corpus.

    python scripts/build_offline_tasks.py [--out sa_lightning/eval/tasks/data]

The output is deterministic; tests/test_eval.py checks the shipped files against it.
"""
import argparse

from sa_lightning.eval.offline import DATA_DIR, build

if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(DATA_DIR))
    for name, path in build(parser.parse_args().out).items():
        print(f"{name}: {path}")
