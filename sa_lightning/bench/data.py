"""``cli.py bench data``: how fast stream mode starts and how many tokens/s it feeds one rank.

    python cli.py bench data --config configs/data/slimpajama_6b.yaml --stand_in /tmp/slimpajama_stand_in
    python cli.py bench data --config configs/data/slimpajama_6b.yaml --stand_in DIR --mistral_format

``--stand_in DIR`` writes local jsonl shards in SlimPajama's schema (from the shipped corpus) into DIR
and points the config's sources at them as a ``files`` source: the same ``load_dataset(...,
streaming=True)`` path as the Hub. ``--mistral_format`` swaps the config's tokenizer for a locally
trained tokenizer.json of Mistral's kind (the real one needs the network). Each measurement starts
from an empty cache, as a first launch does. It reports the seconds from constructing the DataModule
to the first batch, and tokens/s with one worker and with the config's worker count, against what
one GPU of the paper's run consumes (``--gpu_tokens_per_s``, default 60k; see docs/benchmarks.md).
"""
from __future__ import annotations

import argparse
import os
import tempfile
import time
from datetime import date

from ..utils.atomic import write_text
from ..utils.cache import data_cache
from ..utils.report import head, row
from .machine import describe, positive_int
from ..utils.argtypes import doc_help


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="cli.py bench data", **doc_help(__doc__))
    p.add_argument("--config", required=True, help="a data config (configs/data/*.yaml) or a fit config")
    p.add_argument("--stand_in", help="write/read SlimPajama-schema stand-in shards in this folder "
                   "(default: none, the config's own source)")
    p.add_argument("--shards", type=positive_int, default=8, help="stand-in train shards")
    p.add_argument("--stand_in_tokens", type=positive_int, default=20_000_000, help="about this many stand-in train tokens")
    p.add_argument("--mistral_format", action="store_true", help="use a locally built Mistral-format tokenizer.json")
    p.add_argument("--tokenizer", help="override the config's tokenizer (default: the config's)")
    p.add_argument("--workers", type=int, nargs="+", help="worker counts to time (default: 1 and the config's)")
    p.add_argument("--seconds", type=float, default=15.0, help="timed seconds per worker count")
    p.add_argument("--batch_size", type=positive_int, help="override the config's batch size (default: the config's)")
    p.add_argument("--gpu_tokens_per_s", type=float, default=60_000.0, help="what one GPU of the run consumes")
    p.add_argument("--out", help="also write the table to this markdown file (default: none, printed only)")
    return p


def _datamodule(config: str, overrides: list[str], cache_dir: str):
    from ..data.prepare import _as_data_config, build_parser as data_parser

    parser = data_parser()
    cfg = parser.parse_args(_as_data_config(["--config", config, *overrides, "--data.cache_dir", cache_dir,
                                             "--data.progress", "false"]))
    return parser.instantiate_classes(cfg).data


def measure(config: str, overrides: list[str], workers: int, seconds: float) -> dict:
    """One cold start: DataModule -> prepare_data -> setup -> loader; then tokens/s for ``seconds``."""
    with tempfile.TemporaryDirectory(prefix="bench_data_") as cache:
        t0 = time.perf_counter()
        dm = _datamodule(config, [*overrides, "--data.num_workers", str(workers)], cache)
        if dm.mode != "stream":
            raise ValueError(f"bench data measures stream mode, but {config} resolves to data.mode {dm.mode!r}; "
                             "pass --stand_in or a files/hub source.")
        dm.prepare_data()
        dm.setup("fit")
        loader = dm.train_dataloader()
        it = iter(loader)
        first = next(it)
        first_s = time.perf_counter() - t0
        tokens, t1 = 0, time.perf_counter()
        while time.perf_counter() - t1 < seconds:
            tokens += next(it)[:, 1:].numel()
        rate = tokens / (time.perf_counter() - t1)
        del it, loader
    return {"workers": workers, "first_batch_s": first_s, "tokens_per_s": rate, "per_worker": rate / max(workers, 1),
            "batch": tuple(first.shape), "tokenizer": dm.tokenizer_name, "vocab": dm.vocab_size,
            "source": dm.train_source.describe()}


def main(argv: list[str] | None = None) -> list[dict]:
    args = build_parser().parse_args(argv)
    overrides: list[str] = []
    if args.stand_in:
        from ..data.standin import write_slimpajama

        folder = write_slimpajama(args.stand_in, shards=args.shards, min_train_tokens=args.stand_in_tokens)
        for split, glob in (("train", "train-*.jsonl"), ("val", "validation-*.jsonl")):
            overrides += [f"--data.{split}", f'{{"kind": "files", "paths": ["{folder / glob}"], "text_field": "text"}}']
    tokenizer = args.tokenizer
    if args.mistral_format:
        from ..data.standin import write_mistral_format_tokenizer

        cache_root = os.path.expanduser(data_cache())
        tokenizer = str(write_mistral_format_tokenizer(os.path.join(cache_root, "mistral_format", "tokenizer.json")))
    if tokenizer:
        overrides += ["--data.tokenizer", tokenizer]
    if args.batch_size:
        overrides += ["--data.batch_size", str(args.batch_size)]
    configured = _datamodule(args.config, overrides, tempfile.gettempdir()).num_workers
    counts = args.workers or sorted({1, max(configured, 1)})
    rows = []
    for w in counts:
        measured = measure(args.config, overrides, w, args.seconds)
        rows.append(measured)
        print(f"{w} worker(s): first batch after {measured['first_batch_s']:.1f} s, "
              f"{measured['tokens_per_s']:,.0f} tokens/s", flush=True)
    text = markdown(rows, args, configured)
    print(text)
    if args.out:
        write_text(args.out, text + "\n")
    return rows


def markdown(rows: list[dict], args, configured: int) -> str:
    r0 = rows[0]
    intro = (f"Stream mode, {args.config} ({r0['source']}), tokenizer {r0['tokenizer']} (vocab {r0['vocab']}), "
             f"batch {r0['batch'][0]} x {r0['batch'][1]} tokens, config's workers {configured}; {describe('cpu')}, "
             f"{os.cpu_count()} cores, {date.today().isoformat()}.")
    lines = [intro, "", *head(["workers", "first batch (s)", "tokens/s", "tokens/s per worker", "x one GPU's need"],
                              "---:")]
    for r in rows:
        lines.append(row([r["workers"], f"{r['first_batch_s']:.1f}", f"{r['tokens_per_s']:,.0f}",
                          f"{r['per_worker']:,.0f}", f"{r['tokens_per_s'] / args.gpu_tokens_per_s:.1f}"]))
    return "\n".join(lines)
