"""A GGUF file in the models cache, converted once into a Hugging Face folder beside it.

Loading SmolLM2 from its GGUF (98 MB, Q4_1) parses the file's header and tokenizer and dequantizes every
tensor, on every run: about half a minute on a 2-core CPU (``docs/benchmarks.md``). So ``cli.py fetch smollm2``,
or the first load of a file fetched before this module existed, does it once and writes what the GGUF load
gives, unchanged, as ``<name>.hf/`` beside the file: ``config.json``, ``generation_config.json``,
``model.safetensors`` (float32, the dtype the GGUF load gives), the tokenizer files and ``converted_from.json``,
the key of the GGUF it came from. Every later load (``sources.load_causal_lm``, ``tokenizer_for``,
``load_config``) reads the folder.

- **Keyed.** The key is the GGUF's name, size, mtime, a SHA-256 of its first and last MiB, and the transformers
  version that dequantized it. A folder whose key is not the file's (a re-fetch, another file under the name,
  a transformers upgrade) is rebuilt.
- **Whole or absent.** The folder is built under a temporary name and renamed into place when complete
  (``utils.atomic.replacing_folder``), under a lock file, so that two processes (pytest workers, two sweeps)
  convert once and a reader never sees half a folder.
- **Never in the way.** When the folder cannot be written (a read-only cache, a full disk) or the conversion
  fails, one line on stderr says so and the load reads the GGUF, as before; a process tries once per file.
- **Only the cache.** Only GGUF files under ``sources.cache_root()`` are converted: a GGUF elsewhere is the
  user's, and nothing is written beside it.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Iterator

FORMAT = 1  # bump when what the folder holds changes: every folder is then rebuilt
KEY_FILE = "converted_from.json"
REQUIRED = ("config.json", "model.safetensors", KEY_FILE)
SAMPLE = 1 << 20  # bytes hashed at each end of the file
_FAILED: dict[tuple, str] = {}  # (path, key) -> why: a conversion that failed is not retried in this process


def folder_for(gguf: str | os.PathLike) -> Path:
    """Where ``gguf``'s converted folder lives: beside it, ``model.Q4_1.gguf`` -> ``model.Q4_1.hf``."""
    gguf = Path(gguf)
    stem = gguf.name[:-len(".gguf")] if gguf.name.lower().endswith(".gguf") else gguf.name
    return gguf.with_name(f"{stem}.hf")


def in_cache(gguf: str | os.PathLike) -> bool:
    """Whether ``gguf`` lies under the models cache (the only place a converted folder is written)."""
    from .sources import cache_root

    try:  # the folder the name is in, not where a symlink points: the converted folder goes beside the name
        Path(gguf).parent.resolve().relative_to(cache_root().resolve())
    except ValueError:
        return False
    return True


def gguf_key(gguf: str | os.PathLike) -> dict:
    """What the converted folder must have been made from: reads 2 MiB of the file, never parses it."""
    import transformers

    gguf = Path(gguf)
    stat = gguf.stat()
    digest = hashlib.sha256()
    with open(gguf, "rb") as fh:
        digest.update(fh.read(SAMPLE))
        if stat.st_size > 2 * SAMPLE:
            fh.seek(-SAMPLE, os.SEEK_END)
        digest.update(fh.read(SAMPLE))
    return {"format": FORMAT, "gguf": gguf.name, "size": stat.st_size, "mtime_ns": stat.st_mtime_ns,
            "sample_sha256": digest.hexdigest(), "transformers": transformers.__version__}


def _record(folder: Path) -> dict | None:
    if not all((folder / name).is_file() for name in REQUIRED):
        return None
    try:
        return json.loads((folder / KEY_FILE).read_text())
    except (OSError, ValueError):
        return None


def converted(gguf: str | os.PathLike, key: dict | None = None) -> dict | None:
    """The record of ``gguf``'s converted folder (its key and ``model_type``) if the folder is whole and made
    from this very file; else None. Cheap: a stat and 2 MiB read."""
    folder = folder_for(gguf)
    record = _record(folder)
    if record is None:
        return None
    try:
        key = key or gguf_key(gguf)
    except OSError:
        return None
    return record if all(record.get(k) == v for k, v in key.items()) else None


def converted_model_type(gguf: str | os.PathLike) -> str | None:
    """The GGUF's transformers model type as recorded at conversion, when the folder is current (so that
    ``sources.resolve`` need not parse the GGUF header again); None otherwise."""
    record = converted(gguf) if in_cache(gguf) else None
    return record.get("model_type") if record else None


def load_gguf_model(gguf: Path):
    """The GGUF load itself: what ``sources.load_causal_lm`` did on every run before (float32, as ``"auto"``)."""
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32).eval()


def load_gguf_tokenizer(gguf: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)


def write_hf_folder(gguf: Path, folder: Path) -> str:
    """Load ``gguf`` once and write it as a Hugging Face folder into ``folder``; returns its model type.

    ``save_pretrained`` refuses a model loaded from GGUF (it counts as quantized), so the weights go through
    safetensors directly (tied weights once) and the config loses its ``quantization_config``: the folder is a
    plain float32 model, which loads without the gguf package."""
    import copy

    from safetensors.torch import save_model

    model = load_gguf_model(gguf)
    config = copy.deepcopy(model.config)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.save_pretrained(folder)
    if getattr(model, "generation_config", None) is not None:
        model.generation_config.save_pretrained(folder)
    save_model(model, str(folder / "model.safetensors"), metadata={"format": "pt"})
    load_gguf_tokenizer(gguf).save_pretrained(folder)
    return config.model_type


@contextlib.contextmanager
def _locked(folder: Path) -> Iterator[None]:
    """One converter at a time per folder (a lock file beside it); where ``fcntl`` is missing, no lock."""
    try:
        import fcntl
    except ImportError:
        yield
        return
    with open(folder.parent / f".{folder.name}.lock", "a") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def _remove_stale(folder: Path) -> None:
    """Temporary folders (``.<name>.<pid>.partial``, ``.<name>.<pid>.old``) left by a converter that was killed."""
    from ..utils.atomic import _alive

    for p in folder.parent.glob(f".{folder.name}.*"):
        parts = p.name.rsplit(".", 2)
        if p.is_dir() and len(parts) == 3 and parts[1].isdigit() and parts[2] in ("partial", "old") \
                and (int(parts[1]) == os.getpid() or not _alive(int(parts[1]))):
            shutil.rmtree(p, ignore_errors=True)


def _why(err: BaseException) -> str:
    if isinstance(err, OSError) and err.errno:
        return os.strerror(err.errno)
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0][:160]}" if text else type(err).__name__


def ensure(gguf: str | os.PathLike) -> Path | None:
    """``gguf``'s converted folder, built now if it is missing or stale; None where none is used: a GGUF outside
    the cache, or a conversion that could not be written (said in one line on stderr, once per process)."""
    gguf = Path(gguf)
    if not in_cache(gguf):
        return None
    folder = folder_for(gguf)
    try:
        key = gguf_key(gguf)
    except OSError:
        return None  # the GGUF load names the problem
    if converted(gguf, key):
        return folder
    memo = (str(gguf.resolve()), tuple(key.items()))
    if memo in _FAILED:
        return None
    from ..utils.atomic import replacing_folder

    try:
        with _locked(folder):
            if converted(gguf, key):  # another process built it while this one waited
                return folder
            _remove_stale(folder)
            print(f"{gguf.name}: converting the GGUF once into {folder} (later loads read it; about a minute) ...",
                  file=sys.stderr, flush=True)
            start = time.perf_counter()
            with replacing_folder(folder, "converted model folder", overwrite=True, flag="the converted folder") \
                    as tmp:
                model_type = write_hf_folder(gguf, tmp)
                (tmp / KEY_FILE).write_text(json.dumps({**key, "model_type": model_type}, indent=2) + "\n")
    except Exception as err:  # noqa: BLE001 - a cache: whatever went wrong, the GGUF itself still loads
        _FAILED[memo] = _why(err)
        print(f"{gguf.name}: could not write its converted folder {folder} ({_why(err)}); loading from the GGUF, "
              "which is slower.", file=sys.stderr, flush=True)
        return None
    print(f"{gguf.name}: converted in {time.perf_counter() - start:.0f}s", file=sys.stderr, flush=True)
    return folder
