"""``cli.py prepare``: tokenize a config's data into the token cache that cache-mode ``fit`` memory-maps.

    python cli.py prepare --config configs/pretrain_360m.yaml --num_proc 16
    python cli.py prepare --config configs/data/slimpajama_6b.yaml --data.train.path /data/SlimPajama-6B

It reads the ``data`` section of a fit config (or a data config file alone), tokenizes the training
source with ``--num_proc`` processes (one shard per task, joined in shard order, so the cache does not
depend on the process count) and caches the validation blocks. Run it once, as its own job, before a
multi-GPU ``fit --data.mode cache``: ``sa_lightning/slurm/prepare.sbatch`` or ``cli.py submit prepare``.
"""
from __future__ import annotations

import os
import time
from typing import Any


def build_parser():
    from jsonargparse import ActionConfigFile, ArgumentParser

    from ..utils.help_format import PlainHelpFormatter
    from .datamodule import LMDataModule

    parser = ArgumentParser(prog="cli.py prepare", description=__doc__.split("\n\n")[0], parser_mode="omegaconf",
                            formatter_class=PlainHelpFormatter)
    parser.add_argument("--config", action=ActionConfigFile,
                        help="a fit config (its data section is used) or a data config; without one, the defaults below")
    parser.add_class_arguments(LMDataModule, "data")
    for other in ("model", "trainer", "seed_everything", "ckpt_path", "optimizer", "lr_scheduler"):
        parser.add_argument(f"--{other}", type=Any, default=None, help="a fit config's section that prepare ignores (it reads only data)")
    # null, not this machine's count: the help shipped with the package (``sa_lightning/help/``) is the same anywhere
    parser.add_argument("--num_proc", type=int | None, default=None,
                        help="tokenizing processes; null: one per CPU core of this machine")
    parser.add_argument("--overwrite", type=bool, default=False, help="rebuild caches that already exist")
    return parser


def _as_data_config(argv: list[str]) -> list[str]:
    """A data config file (no top-level ``data`` key) is read as the ``data`` section."""
    from ..utils.yamlfile import load_yaml

    out = list(argv)
    for i, arg in enumerate(argv[:-1]):
        if arg == "--config" and os.path.isfile(argv[i + 1]):
            loaded = load_yaml(argv[i + 1], "--config") or {}
            if isinstance(loaded, dict) and "data" not in loaded and {"train", "tokenizer"} & set(loaded):
                out[i] = "--data"
    return out


def main(argv: list[str] | None = None) -> dict:
    parser = build_parser()
    cfg = parser.parse_args(_as_data_config(list(argv or [])))
    if cfg.num_proc is None:
        cfg.num_proc = os.cpu_count() or 1
    if cfg.num_proc < 1:
        raise ValueError(f"--num_proc must be >= 1, got {cfg.num_proc}.")
    dm = parser.instantiate_classes(cfg).data
    start = time.perf_counter()
    folders = dm.prepare(num_proc=cfg.num_proc, overwrite=cfg.overwrite)
    import json

    for split, folder in folders.items():
        meta = json.loads((folder / "meta.json").read_text())
        print(f"{split}: {meta['num_tokens']:,} tokens, {meta['num_documents']:,} documents "
              f"({meta['tokens_per_second']:,.0f} tokens/s when written) -> {folder}")
    print(f"prepared in {time.perf_counter() - start:.1f} s; fit reads it with data.mode: cache"
          + ("" if dm.mode == "cache" else " (this config streams by default: add --data.mode cache)"))
    return folders
