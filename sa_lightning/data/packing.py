"""Tokenize and pack documents into a flat token file, then serve fixed blocks of seq_len + 1 tokens.

Documents are joined with EOS into one stream, so a document's tail carries over into the next
block instead of being padded. The stream is written once (``prepare_tokens``) to a cache folder
keyed by source, tokenizer and cap; training then reads blocks by memory map. Fixed blocks make
sharding over ranks and workers exact and a mid-epoch resume land on the next unseen block.
"""
from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

from .corpus import SourceConfig, documents

FORMAT_VERSION = 1


def cache_key(source: SourceConfig, tokenizer_name: str, vocab_size: int, max_tokens: int | None) -> str:
    blob = json.dumps([FORMAT_VERSION, source.describe(), source.text_field, tokenizer_name, vocab_size, max_tokens])
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _dtype(vocab_size: int):
    return np.uint16 if vocab_size <= np.iinfo(np.uint16).max + 1 else np.uint32


def prepare_tokens(source: SourceConfig, tokenizer, tokenizer_name: str, cache_dir: str | Path,
                   max_tokens: int | None = None, batch_docs: int = 256, progress: bool = True) -> Path:
    """Write ``tokens.bin`` + ``meta.json`` for ``source`` once; later calls return the cached folder.

    The folder appears atomically (written under a temporary name, then renamed), so an interrupted
    prepare never leaves a half file that looks finished.
    """
    vocab = len(tokenizer)
    out = Path(cache_dir).expanduser() / f"{source.describe().replace('/', '_').replace(':', '_')[:80]}-{cache_key(source, tokenizer_name, vocab, max_tokens)}"
    if (out / "meta.json").is_file():
        return out
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    tmp.mkdir(parents=True, exist_ok=True)
    dtype, eos = _dtype(vocab), tokenizer.eos_token_id
    n_tokens = n_docs = 0
    t0 = time.perf_counter()
    bar = _progress(progress, f"tokenizing {source.describe()}")
    with open(tmp / "tokens.bin", "wb") as f:
        batch: list[str] = []

        def flush():
            nonlocal n_tokens, n_docs
            ids = tokenizer(batch, add_special_tokens=False)["input_ids"]
            flat = np.fromiter((t for doc in ids for t in (*doc, eos)), dtype=dtype)
            if max_tokens is not None:
                flat = flat[: max_tokens - n_tokens]
            f.write(flat.tobytes())
            n_tokens += len(flat)
            n_docs += len(batch)
            if bar is not None:
                bar.update(len(flat))
            batch.clear()

        for text in documents(source):
            batch.append(text)
            if len(batch) >= batch_docs:
                flush()
                if max_tokens is not None and n_tokens >= max_tokens:
                    break
        if batch and (max_tokens is None or n_tokens < max_tokens):
            flush()
    if bar is not None:
        bar.close()
    if n_tokens == 0:
        raise ValueError(f"data source {source.describe()} produced no tokens: the corpus is empty.")
    seconds = time.perf_counter() - t0
    meta = {"version": FORMAT_VERSION, "source": source.describe(), "tokenizer": tokenizer_name, "vocab_size": vocab,
            "dtype": np.dtype(dtype).name, "num_tokens": n_tokens, "num_documents": n_docs,
            "tokens_per_second": n_tokens / max(seconds, 1e-9)}
    (tmp / "meta.json").write_text(json.dumps(meta, indent=1))
    try:
        tmp.rename(out)
    except OSError:  # another process finished first: keep theirs
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
    return out


def _progress(enabled: bool, desc: str):
    if not enabled:
        return None
    from tqdm.auto import tqdm

    return tqdm(desc=desc, unit=" tok", unit_scale=True, mininterval=2.0)


class PackedBlocks(Dataset):
    """Block ``i`` is tokens [i*(L+1), (i+1)*(L+1)) of the packed stream, as int64 (L = seq_len)."""

    def __init__(self, folder: str | Path, seq_len: int, max_blocks: int | None = None):
        folder = Path(folder)
        self.meta = json.loads((folder / "meta.json").read_text())
        self.path = folder / "tokens.bin"
        self.block = seq_len + 1
        self.num_blocks = self.meta["num_tokens"] // self.block
        if max_blocks is not None:
            self.num_blocks = min(self.num_blocks, max_blocks)
        self._tokens = None  # opened lazily, once per worker process

    def __len__(self) -> int:
        return self.num_blocks

    def tokens(self) -> np.ndarray:
        """The whole packed stream, memory-mapped."""
        if self._tokens is None:
            self._tokens = np.memmap(self.path, dtype=self.meta["dtype"], mode="r")
        return self._tokens

    def __getitem__(self, i: int) -> torch.Tensor:
        self.tokens()
        if not 0 <= i < self.num_blocks:
            raise IndexError(f"block {i} out of range [0, {self.num_blocks}).")
        return torch.from_numpy(self._tokens[i * self.block:(i + 1) * self.block].astype(np.int64))
