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
import shutil
import time
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

from .corpus import SourceConfig, documents, open_stream, own_progress_locks, resolve_files, text_view, texts_of
from .tokenizer import encode

FORMAT_VERSION = 2  # 2: meta.json records the tokenizer's and the source files' fingerprints


def cache_key(source: SourceConfig, tokenizer_name: str, vocab_size: int, max_tokens: int | None) -> str:
    blob = json.dumps([FORMAT_VERSION, source.describe(), source.text_field, tokenizer_name, vocab_size, max_tokens])
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def cache_folder(source: SourceConfig, tokenizer, tokenizer_name: str, cache_dir: str | Path,
                 max_tokens: int | None) -> Path:
    """Where ``source`` tokenized by ``tokenizer`` (capped at ``max_tokens``) is cached."""
    name = source.describe().replace("/", "_").replace(":", "_")[:80]
    return Path(cache_dir).expanduser() / f"{name}-{cache_key(source, tokenizer_name, len(tokenizer), max_tokens)}"


def _dtype(vocab_size: int):
    return np.uint16 if vocab_size <= np.iinfo(np.uint16).max + 1 else np.uint32


def tokenizer_fingerprint(tokenizer) -> str:
    return hashlib.sha256(tokenizer.backend_tokenizer.to_str().encode()).hexdigest()[:16]


def source_fingerprint(source: SourceConfig) -> list | None:
    """(path, size, mtime) of local source files: a cache built before they changed is stale."""
    if source.kind != "files":
        return None
    stats = [(f, os.stat(f)) for f in resolve_files(source.paths)]
    return [[f, st.st_size, st.st_mtime_ns] for f, st in stats]


class StaleCache(ValueError):
    """A finished cache of this project that no longer matches its source or is damaged; ``reason`` says why."""

    def __init__(self, message: str, reason: str):
        super().__init__(message)
        self.reason = reason


def check_cache(folder: Path, source: SourceConfig, tokenizer, tokenizer_name: str) -> dict:
    """The meta of a finished cache folder, or one sentence saying why it cannot be used (``StaleCache`` when
    it is this project's cache but out of date or damaged)."""
    fix = f"delete {str(folder)!r} or rebuild it with `python cli.py prepare --config <your config> --overwrite`."
    meta_path = folder / "meta.json"
    if not meta_path.is_file():
        raise ValueError(f"the token cache folder {str(folder)!r} exists but holds no meta.json, so it is not a "
                         f"finished cache of this project (a foreign folder or a copy cut short); {fix}")
    try:
        meta = json.loads(meta_path.read_text())
    except (OSError, ValueError) as err:
        raise StaleCache(f"the token cache {str(folder)!r} has an unreadable meta.json ({err}); {fix}",
                         f"its meta.json is unreadable ({err})") from None
    expected = {"version": FORMAT_VERSION, "source": source.describe(), "tokenizer": tokenizer_name,
                "vocab_size": len(tokenizer), "tokenizer_fingerprint": tokenizer_fingerprint(tokenizer),
                "source_files": source_fingerprint(source)}
    stale = [k for k, v in expected.items() if meta.get(k) != v]
    if stale:
        said = "; ".join(f"{k}: cache {meta.get(k)!r}, now {expected[k]!r}" for k in stale
                         if k != "source_files") or "the source files changed since it was built"
        if "source_files" in stale and len(stale) > 1:
            said += "; the source files changed since it was built"
        raise StaleCache(f"the token cache {str(folder)!r} is stale or was built for other data ({said}); {fix}", said)
    tokens = folder / "tokens.bin"
    size = np.dtype(meta["dtype"]).itemsize * meta["num_tokens"]
    if not tokens.is_file() or tokens.stat().st_size != size:
        raise StaleCache(f"the token cache {str(folder)!r} is damaged: tokens.bin should hold {size} bytes; {fix}",
                         f"its tokens.bin should hold {size} bytes")
    return meta


def prepare_tokens(source: SourceConfig, tokenizer, tokenizer_name: str, cache_dir: str | Path,
                   max_tokens: int | None = None, batch_docs: int = 256, progress: bool = True,
                   num_proc: int = 1, overwrite: bool = False, rebuild_stale: bool = False) -> Path:
    """Write ``tokens.bin`` + ``meta.json`` for ``source`` once; later calls check and return the folder.

    With ``num_proc`` > 1 the source's shards are tokenized by that many processes and joined in shard
    order, so the cache is byte for byte the one a single process writes. The folder appears
    atomically (written under a temporary name, then renamed), so an interrupted prepare never leaves
    a half file that looks finished. With ``rebuild_stale`` a cache whose source changed (or that is damaged)
    is rebuilt in its place, with one line saying so, instead of refused.
    """
    out = cache_folder(source, tokenizer, tokenizer_name, cache_dir, max_tokens)
    stale = False
    if out.exists() and overwrite:
        shutil.rmtree(out)
    if out.exists():
        try:
            check_cache(out, source, tokenizer, tokenizer_name)
            return out
        except StaleCache as err:
            if not rebuild_stale:
                raise
            print(f"data: the cache {str(out)!r} of {source.describe()} is out of date ({err.reason}); rebuilding it",
                  flush=True)
            stale = True
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    tmp.mkdir(parents=True, exist_ok=True)
    dtype = _dtype(len(tokenizer))
    t0 = time.perf_counter()
    bar = _progress(progress, f"tokenizing {source.describe()}")
    try:
        shards = open_stream(source).num_shards if num_proc > 1 and source.kind != "embedded" else 1
        if min(num_proc, shards) > 1:
            n_tokens, n_docs = _tokenize_parallel(source, tokenizer_name, tmp / "tokens.bin", dtype, max_tokens,
                                                  batch_docs, min(num_proc, shards), shards, bar)
        else:
            if num_proc > 1:
                print(f"data: {source.describe()} is one shard, so it is tokenized by one process", flush=True)
            n_tokens, n_docs = _tokenize_serial(source, tokenizer, tmp / "tokens.bin", dtype, max_tokens,
                                                batch_docs, bar)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        if bar is not None:
            bar.close()
    if n_tokens == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        raise ValueError(f"data source {source.describe()} produced no tokens: the corpus is empty.")
    seconds = time.perf_counter() - t0
    meta = {"version": FORMAT_VERSION, "source": source.describe(), "tokenizer": tokenizer_name,
            "vocab_size": len(tokenizer), "tokenizer_fingerprint": tokenizer_fingerprint(tokenizer),
            "source_files": source_fingerprint(source), "dtype": np.dtype(dtype).name, "num_tokens": n_tokens,
            "num_documents": n_docs, "max_tokens": max_tokens, "seconds": seconds,
            "tokens_per_second": n_tokens / max(seconds, 1e-9)}
    (tmp / "meta.json").write_text(json.dumps(meta, indent=1))
    old = out.with_name(out.name + f".old{os.getpid()}")
    try:
        if stale and out.exists():  # moved aside, so that the new cache appears in one rename
            out.rename(old)
        tmp.rename(out)
    except OSError:  # another process finished first: keep theirs
        shutil.rmtree(tmp, ignore_errors=True)
    shutil.rmtree(old, ignore_errors=True)
    return out


def _tokenize_serial(source, tokenizer, path: Path, dtype, max_tokens, batch_docs, bar) -> tuple[int, int]:
    n_tokens = n_docs = 0
    eos = tokenizer.eos_token_id
    with open(path, "wb") as f:
        batch: list[str] = []

        def flush():
            nonlocal n_tokens, n_docs
            flat = _flatten(encode(tokenizer, batch), eos, dtype)
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
    return n_tokens, n_docs


def _flatten(ids: list[list[int]], eos: int, dtype) -> np.ndarray:
    return np.fromiter((t for doc in ids for t in (*doc, eos)), dtype=dtype)


# ---- several processes: one task per shard, joined in shard order -------------------------------
_WORKER: dict = {}


def _init_worker(tokenizer_name: str, counter) -> None:
    from .tokenizer import load_tokenizer

    _WORKER.update(tokenizer=load_tokenizer(tokenizer_name), counter=counter)


def _tokenize_shard(task) -> tuple[int, int, int]:
    source, index, num_shards, path, dtype_name, batch_docs, max_tokens = task
    tokenizer, counter = _WORKER["tokenizer"], _WORKER["counter"]
    shard = open_stream(source).shard(num_shards=num_shards, index=index, contiguous=True)
    n_tokens = n_docs = 0
    with open(path, "wb") as f:
        for table in text_view(shard, source.text_field).iter(batch_size=batch_docs):
            texts = texts_of(table, source)
            flat = _flatten(encode(tokenizer, texts), tokenizer.eos_token_id, np.dtype(dtype_name))
            f.write(flat.tobytes())
            n_tokens, n_docs = n_tokens + len(flat), n_docs + len(texts)
            with counter.get_lock():
                counter.value += len(flat)
            if max_tokens is not None and n_tokens >= max_tokens:  # no shard needs more than the whole cap
                break
    return index, n_tokens, n_docs


def _shard_process(tokenizer_name: str, counter, task) -> None:
    """One shard in a process of its own: its tokens into its part file, then ``<part>.count`` (tokens and
    documents), or ``<part>.error`` (what went wrong) and a non-zero exit."""
    part = Path(task[3])
    own_progress_locks()
    try:
        _init_worker(tokenizer_name, counter)
        _, tokens, docs = _tokenize_shard(task)
    except BaseException as err:
        part.with_suffix(".error").write_text(f"{type(err).__name__}: {err}")
        raise
    part.with_suffix(".count").write_text(f"{tokens} {docs}")


def _tokenize_parallel(source, tokenizer_name, path: Path, dtype, max_tokens, batch_docs, procs, shards,
                       bar) -> tuple[int, int]:
    """The shards ``procs`` at a time, a process each, joined in order. A process per shard rather than a
    ``multiprocessing.Pool``: stopping at ``max_tokens`` ends the processes still running with ``terminate`` and
    ``join``, where ``Pool.terminate`` during an ``imap`` can wait minutes on its handler threads (CPython
    gh-96995; a test here waited 400 s at load 8)."""
    import multiprocessing as mp

    # fork starts a worker in milliseconds (spawn re-imports Lightning for each); the workers touch no torch,
    # and tokenizers is told before the fork that the processes, not its threads, are the parallelism
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    ctx = mp.get_context("fork" if "fork" in mp.get_all_start_methods() else "spawn")
    counter = ctx.Value("q", 0)
    parts = path.parent / "parts"
    parts.mkdir()
    tasks = [(source, i, shards, str(parts / f"{i:06d}.bin"), np.dtype(dtype).name, batch_docs, max_tokens)
             for i in range(shards)]
    print(f"data: tokenizing {source.describe()}: {shards} shards with {procs} processes", flush=True)
    n_tokens = n_docs = shown = 0
    itemsize = np.dtype(dtype).itemsize
    started: dict[int, object] = {}

    def start_more() -> None:  # keep procs shards tokenizing
        while len(started) < shards and sum(p.is_alive() for p in started.values()) < procs:
            i = len(started)
            started[i] = ctx.Process(target=_shard_process, args=(tokenizer_name, counter, tasks[i]), daemon=True)
            started[i].start()

    try:
        with open(path, "wb") as out:
            for i in range(shards):
                start_more()
                while started[i].is_alive():
                    started[i].join(timeout=1.0)
                    start_more()
                    if bar is not None:
                        bar.update(counter.value - shown)
                        shown = counter.value
                part = parts / f"{i:06d}.bin"
                if started[i].exitcode != 0:
                    error = part.with_suffix(".error")
                    why = error.read_text() if error.is_file() else f"its process ended with code {started[i].exitcode}"
                    # one line at the command (the shard's own traceback is printed above it, by its process)
                    raise ValueError(f"tokenizing shard {i} of {shards} of {source.describe()} failed: {why}")
                tokens, docs = map(int, part.with_suffix(".count").read_text().split())
                keep = tokens if max_tokens is None else min(tokens, max_tokens - n_tokens)
                with open(part, "rb") as f:
                    shutil.copyfileobj(_Head(f, keep * itemsize), out)
                n_tokens, n_docs = n_tokens + keep, n_docs + docs
                os.remove(part)
                if max_tokens is not None and n_tokens >= max_tokens:
                    break
        if bar is not None:
            bar.update(max(counter.value - shown, 0))
    finally:  # the cap reached, an error or a signal: the shards still running end here
        for process in started.values():
            if process.is_alive():
                process.terminate()
        for process in started.values():
            process.join()
    shutil.rmtree(parts, ignore_errors=True)
    return n_tokens, n_docs


class _Head:
    """The first ``size`` bytes of file ``f``, as a file-like object for ``copyfileobj``."""

    def __init__(self, f, size: int):
        self.f, self.left = f, size

    def read(self, n: int = -1) -> bytes:
        n = self.left if n < 0 else min(n, self.left)
        data = self.f.read(n)
        self.left -= len(data)
        return data


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
