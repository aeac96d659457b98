"""Document sources: the embedded corpus, local files (txt/jsonl/parquet, globs), and the Hugging Face Hub.

Each source yields plain-text documents in a fixed order. Local files and the Hub both go through
``datasets.load_dataset(..., streaming=True)``, so nothing is copied before tokenization starts.
"""
from __future__ import annotations

import glob
import gzip
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

EMBEDDED_DIR = Path(__file__).parent / "embedded"
SOURCES = ("embedded", "files", "hub")
_FILE_BUILDERS = {".txt": "text", ".jsonl": "json", ".json": "json", ".parquet": "parquet"}


def embedded_documents(split: str = "train") -> Iterator[str]:
    """Scenes of Shakespeare's plays (see embedded/README.md); ``validation`` holds out three plays."""
    with gzip.open(embedded_file(split), "rt", encoding="utf-8") as f:
        for line in f:
            yield json.loads(line)["text"]


@dataclass
class SourceConfig:
    """Where documents come from.

    - ``embedded``: the shipped corpus; ``split`` is train or validation.
    - ``files``: ``paths`` are files or globs of .txt (one document per file), .jsonl/.json or .parquet
      (one document per record, text in ``text_field``).
    - ``hub``: ``path`` is a dataset id (e.g. DKYoon/SlimPajama-6B), ``name`` its config, ``split``.
    """

    kind: str = "embedded"
    path: str | None = None
    paths: list[str] = field(default_factory=list)
    name: str | None = None
    split: str = "train"
    text_field: str = "text"

    def __post_init__(self):
        if self.kind not in SOURCES:
            raise ValueError(f"data source kind must be one of {', '.join(SOURCES)}, got {self.kind!r}.")
        if self.kind == "hub" and not self.path:
            raise ValueError("a hub data source needs path: <dataset id>, e.g. DKYoon/SlimPajama-6B.")
        if self.kind == "files" and not self.paths:
            raise ValueError("a files data source needs paths: a list of files or globs (.txt, .jsonl, .parquet).")

    def describe(self) -> str:
        if self.kind == "embedded":
            return f"embedded:{self.split}"
        if self.kind == "files":
            return "files:" + ",".join(self.paths)
        return f"hub:{self.path}" + (f"/{self.name}" if self.name else "") + f":{self.split}"


def resolve_files(patterns: list[str]) -> list[str]:
    """Expand globs; every pattern must match a readable file with a known extension."""
    files: list[str] = []
    for pattern in patterns:
        matches = sorted(glob.glob(os.path.expanduser(pattern), recursive=True))
        if not matches:
            raise FileNotFoundError(f"data path {pattern!r} matches no file.")
        for path in matches:
            if _format(path) is None:
                raise ValueError(f"data file {path!r} has an unsupported extension; expected .txt, .jsonl, .json or .parquet.")
            if not os.access(path, os.R_OK) or not os.path.isfile(path):
                raise PermissionError(f"data file {path!r} is not a readable file.")
            files.append(path)
    kinds = {_format(f) for f in files}
    if len(kinds) > 1:
        raise ValueError(f"data paths mix formats ({', '.join(sorted(kinds))}); give one format per source.")
    return files


def _format(path: str) -> str | None:
    """The ``datasets`` builder for a data file, from its extension (None if unsupported)."""
    return _FILE_BUILDERS.get(".jsonl" if path.endswith(".jsonl.gz") else Path(path).suffix)


def _offline() -> bool:
    return os.environ.get("HF_DATASETS_OFFLINE") == "1" or os.environ.get("HF_HUB_OFFLINE") == "1"


def embedded_file(split: str) -> Path:
    path = EMBEDDED_DIR / f"shakespeare_{split}.jsonl.gz"
    if not path.is_file():
        raise ValueError(f"the embedded corpus has no split {split!r}; choose train or validation.")
    return path


def open_stream(source: SourceConfig):
    """``source`` as a ``datasets.IterableDataset`` (``load_dataset(..., streaming=True)``): nothing is
    downloaded or copied before iteration. The embedded corpus is one jsonl.gz shard."""
    import datasets

    if source.kind in ("files", "embedded"):
        files = resolve_files(source.paths) if source.kind == "files" else [str(embedded_file(source.split))]
        builder = _format(files[0])
        kwargs = {"sample_by": "document"} if builder == "text" else {}
        try:
            return datasets.load_dataset(builder, data_files=files, split="train", streaming=True, **kwargs)
        except (Exception, StopIteration) as err:  # an empty file stops schema inference
            raise ValueError(f"data source {source.describe()} could not be read: it is empty or damaged "
                             f"({type(err).__name__}: {err}).") from err
    try:
        return datasets.load_dataset(source.path, source.name, split=source.split, streaming=True)
    except Exception as err:  # the Hub raises many types when unreachable
        if _offline() or "offline" in str(err).lower() or "connect" in str(err).lower():
            raise ConnectionError(
                f"data source {source.describe()} needs the network to stream from the Hugging Face Hub, "
                "which is unreachable here; use kind: embedded or kind: files with local paths."
            ) from err
        raise


def documents(source: SourceConfig) -> Iterator[str]:
    """Plain-text documents of ``source`` in a fixed order."""
    if source.kind == "embedded":
        yield from embedded_documents(source.split)
        return
    stream = open_stream(source)
    try:
        for record in stream:
            yield _text(record, source)
    except (KeyError, ConnectionError):
        raise
    except (Exception, StopIteration) as err:  # pyarrow/json decoders raise many types for a damaged file
        raise ValueError(f"data source {source.describe()} could not be read ({type(err).__name__}: {err}).") from err


def text_view(ds, text_field: str):
    """A ``datasets.IterableDataset`` reduced to its text column, iterated as Arrow tables (fast batches)."""
    return ds.select_columns([text_field]).with_format("arrow")


def texts_of(table, source: SourceConfig) -> list[str]:
    """The texts of one Arrow batch from ``text_view``; a record without text fails in one sentence."""
    texts = table.column(source.text_field).to_pylist()
    if any(t is None for t in texts):
        raise KeyError(f"records of {source.describe()} have no text in field {source.text_field!r}; set text_field.")
    return texts


def _text(record: dict, source: SourceConfig) -> str:
    text = record.get(source.text_field)
    if text is None:
        raise KeyError(f"records of {source.describe()} have no field {source.text_field!r}; set text_field.")
    return text
