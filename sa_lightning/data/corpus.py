"""Document sources: the embedded corpus, local files (txt/jsonl/parquet, globs), and the Hugging Face Hub.

Each source yields plain-text documents in a fixed order. Local files and the Hub both go through
``datasets.load_dataset(..., streaming=True)``, so nothing is copied before tokenization starts.
"""
from __future__ import annotations

import glob
import gzip
import json
import logging
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
    - ``hub``: ``path`` is a dataset id (e.g. DKYoon/SlimPajama-6B), ``name`` its config, ``split``, and
      optionally ``revision`` (a branch, tag or commit; a commit pins the data a resumed stream continues in).

    Args:
        kind: ``embedded``, ``files`` or ``hub``.
        path: hub: the dataset id; null for the other kinds.
        paths: files: the files or globs to read.
        name: hub: the dataset's config name; null: its default.
        split: the split to read (embedded: train or validation).
        text_field: the records' text field (files .jsonl/.json/.parquet, hub).
        revision: hub: a branch, tag or commit to read; null: the default branch.
    """

    kind: str = "embedded"
    path: str | None = None
    paths: list[str] = field(default_factory=list)
    name: str | None = None
    split: str = "train"
    text_field: str = "text"
    revision: str | None = None

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
        return (f"hub:{self.path}" + (f"/{self.name}" if self.name else "") + f":{self.split}"
                + (f"@{self.revision}" if self.revision else ""))


class DataSourceError(ValueError):
    """Bad data met while reading a source (a damaged file, a record without text), told in one sentence.

    Raised inside DataLoader workers too: torch re-raises it in the main process as this class with a
    traceback dump for its message, which ``sentence`` turns back into the sentence."""


def sentence(err: BaseException) -> str:
    """The one-sentence message of ``err``, also when torch's DataLoader re-raised it from a worker as
    ``Caught DataSourceError in DataLoader worker process 0. Original Traceback ...: <sentence>``."""
    text = str(err)
    if "Original Traceback" not in text:
        return text
    last = [line for line in text.strip().splitlines() if line.strip()][-1]
    return last.split(f"{type(err).__name__}: ", 1)[-1].strip()


def resolve_files(patterns: list[str]) -> list[str]:
    """Expand globs; every pattern must match a readable file with a known extension."""
    files: list[str] = []
    for pattern in patterns:
        matches = sorted(glob.glob(os.path.expanduser(pattern), recursive=True))
        if not matches:
            raise FileNotFoundError(f"data path {pattern!r} matches no file.")
        for path in matches:
            if os.path.isdir(path):
                raise IsADirectoryError(f"data path {path!r} is a folder, not a data file; name its files with a glob, "
                                        f"e.g. {_glob_for(path)!r}.")
            if _format(path) is None:
                raise ValueError(f"data file {path!r} has an unsupported extension; expected .txt, .jsonl, .json or .parquet.")
            if not os.access(path, os.R_OK) or not os.path.isfile(path):
                raise PermissionError(f"data file {path!r} is not a readable file.")
            files.append(path)
    kinds = {_format(f) for f in files}
    if len(kinds) > 1:
        raise ValueError(f"data paths mix formats ({', '.join(sorted(kinds))}); give one format per source.")
    return files


def _glob_for(folder: str) -> str:
    """A glob for the data files in ``folder``: its most common readable extension, in it or (only there)
    in its subfolders; ``*.jsonl`` when it holds none."""
    def ending(name: str) -> str | None:
        if _format(name) is None:
            return None
        return ".jsonl.gz" if name.endswith(".jsonl.gz") else Path(name).suffix

    root = Path(folder)
    for pattern, prefix in (("*", "*"), ("**/*", "**/*")):
        counts: dict[str, int] = {}
        for path in root.glob(pattern):
            kind = ending(path.name) if path.is_file() else None
            if kind:
                counts[kind] = counts.get(kind, 0) + 1
        if counts:
            return os.path.join(folder, prefix + max(counts, key=counts.get))
    return os.path.join(folder, "*.jsonl")


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


def own_progress_locks(*_) -> None:
    """Give this forked process (a shard of ``prepare``, a stream loader's worker) progress-bar locks of its own.
    tqdm's write lock holds a process semaphore shared with the parent, and ``datasets`` draws a bar as it opens a
    stream. A child ended by SIGTERM inside such a bar (``prepare``'s cap reached or a shard failed; a loader
    worker still busy when its loader shuts down) would keep the semaphore held, and the parent's next bar (a
    validation bar, the next ``prepare``) would wait forever. The ignored arguments let it be a
    ``worker_init_fn``."""
    import threading

    from tqdm.std import TqdmDefaultWriteLock, tqdm

    TqdmDefaultWriteLock.mp_lock, TqdmDefaultWriteLock.th_lock = None, threading.RLock()
    classes = [tqdm]
    while classes:  # every bar class that made its lock before the fork gets a fresh one
        cls = classes.pop()
        classes.extend(cls.__subclasses__())
        if "_lock" in vars(cls):
            cls._lock = TqdmDefaultWriteLock()


def open_stream(source: SourceConfig):
    """``source`` as a ``datasets.IterableDataset`` (``load_dataset(..., streaming=True)``): nothing is
    downloaded or copied before iteration. The embedded corpus is one jsonl.gz shard."""
    import datasets

    if source.kind in ("files", "embedded"):
        files = resolve_files(source.paths) if source.kind == "files" else [str(embedded_file(source.split))]
        builder = _format(files[0])
        kwargs = {"sample_by": "document"} if builder == "text" else {}
        try:
            return _name_bad_files(datasets.load_dataset(builder, data_files=files, split="train", streaming=True,
                                                         **kwargs), source)
        except (Exception, StopIteration) as err:  # an empty file stops schema inference
            raise ValueError(f"data source {source.describe()} could not be read: it is empty or damaged "
                             f"({type(err).__name__}: {err}).") from err
    try:
        extra = {"revision": source.revision} if source.revision else {}
        return _name_bad_files(datasets.load_dataset(source.path, source.name, split=source.split, streaming=True,
                                                     **extra), source)
    except Exception as err:  # the Hub raises many types when unreachable
        if _offline() or "offline" in str(err).lower() or "connect" in str(err).lower():
            raise ConnectionError(
                f"data source {source.describe()} needs the network to stream from the Hugging Face Hub, "
                "which is unreachable here; use kind: embedded or kind: files with local paths."
            ) from err
        raise


class _QuietBadJson(logging.Filter):
    """datasets logs its own line for a damaged JSON file; ``_NamedTables`` raises one sentence saying all of it."""

    LOGGER = "datasets.packaged_modules.json.json"

    def filter(self, record) -> bool:
        return not record.getMessage().startswith("Failed to load JSON from file")

    @classmethod
    def install(cls) -> None:
        """Once per process, in the process that reads the files (a loader's worker too), not at import."""
        logger = logging.getLogger(cls.LOGGER)
        if not any(isinstance(f, cls) for f in logger.filters):
            logger.addFilter(cls())


class _NamedTables:
    """Wraps a ``datasets`` builder's table generator (one call per shard, i.e. per file) so that a file that
    cannot be decoded, or a record without text, fails in one sentence naming the file and the record: the
    decoders' own errors name neither. It counts rows only, so it costs nothing per document."""

    def __init__(self, generate, source: SourceConfig):
        self.generate, self.text_field, self.describe = generate, source.text_field, source.describe()
        self._scanned: dict = {}  # file -> its first record with non-string text, or None

    def __call__(self, **kwargs):
        _QuietBadJson.install()
        files = kwargs.get("original_files") or kwargs.get("files") or kwargs.get("base_files") or []
        tables, rows, shard = self.generate(**kwargs), 0, None
        while True:
            try:
                key, table = next(tables)
            except StopIteration:
                return
            except Exception as err:  # pyarrow, json and parquet decoders raise many types
                name, said = self._name(files, shard), " ".join(str(err).split())
                line = _bad_json_line(files[0]) if len(files) == 1 and "JSON" in said else None
                where = (f"line {line[0]} of data file {name} of {self.describe} is not valid JSON ({line[1]})"
                         if line else f"data file {name} of {self.describe} could not be read after its first "
                                      f"{rows} records ({type(err).__name__}: {said})")
                raise DataSourceError(f"{where}; repair the file or remove it from the data paths.") from err
            now = getattr(key, "original_shard_id", None)
            if now != shard:
                shard, rows = now, 0
            self._check_text(table, files, shard, rows)
            rows += table.num_rows
            yield key, table

    def _check_text(self, table, files, shard, rows: int) -> None:
        names = table.column_names
        if self.text_field not in names:
            raise DataSourceError(f"records of data file {self._name(files, shard)} have no field {self.text_field!r} "
                                  f"(they have {', '.join(names)}); set text_field.")
        column = table.column(self.text_field)
        import pyarrow as pa

        # A record whose text is a number, list, ... makes datasets read that file's column as JSON (each
        # value JSON-encoded), then cast to the string the other files have: the file would train as quoted
        # text. Either sign sends the file (once) to a scan that names the record's line.
        string = pa.types.is_string(column.type) or pa.types.is_large_string(column.type)
        if not string or _any_quoted(column):
            path = self._path(files, shard)
            if path not in self._scanned:
                self._scanned[path] = _non_string_text(path, self.text_field) if path else None
            found = self._scanned[path]
            if found or not string:
                where = (f"line {found[0]} of data file {self._name(files, shard)} has {found[1]}" if found else
                         f"data file {self._name(files, shard)} has records whose field {self.text_field!r} is not "
                         f"a string (the column reads as {column.type})")
                raise DataSourceError(f"{where} in field {self.text_field!r}, where text must be a string; repair or "
                                      "remove that record.")
        if column.null_count:
            import pyarrow.compute as pc

            first = int(pc.index(pc.is_null(column), True).as_py())
            raise DataSourceError(f"record {rows + first + 1} of data file {self._name(files, shard)} has no text in "
                                  f"field {self.text_field!r}; repair or remove that record, or set text_field.")

    @staticmethod
    def _path(files, shard):
        files = list(files) if isinstance(files, (list, tuple)) else []
        if isinstance(shard, int) and 0 <= shard < len(files):
            return files[shard]
        return files[0] if len(files) == 1 else None

    def _name(self, files, shard) -> str:
        path = self._path(files, shard)
        if path is not None:
            return repr(str(path))
        files = list(files) if isinstance(files, (list, tuple)) else []
        return "(one of " + ", ".join(repr(str(f)) for f in files[:3]) + (", ..." if len(files) > 3 else "") + ")"


def _first_line(path, finding, limit: int = 1 << 28) -> tuple[int, str] | None:
    """(line number, ``finding(line)``) of the first line of a local JSON Lines file (gzipped or not) for which
    ``finding`` returns a description, reading at most ``limit`` bytes; only on error paths."""
    try:
        opener = gzip.open if str(path).endswith(".gz") else open
        with opener(str(path), "rb") as f:
            read = 0
            for number, line in enumerate(f, 1):
                read += len(line)
                if read > limit:
                    return None
                found = finding(line) if line.strip() else None
                if found is not None:
                    return number, found
    except OSError:
        return None
    return None


def _bad_json_line(path) -> tuple[int, str] | None:
    """The first line that does not parse (pyarrow's own "in row N" counts within a block of the file)."""

    def error(line):
        try:
            json.loads(line)
        except ValueError as err:
            return f"{type(err).__name__}: {err}"
        return None

    return _first_line(path, error)


def _any_quoted(column) -> bool:
    """Whether a text in this Arrow string column starts and ends with a double quote (two vectorised tests)."""
    import pyarrow.compute as pc

    return bool(pc.any(pc.and_(pc.starts_with(column, '"'), pc.ends_with(column, '"'))).as_py())


def _non_string_text(path, field: str) -> tuple[int, str] | None:
    """The first record whose ``field`` is present and not a string, and what it holds."""

    def non_string(line):
        try:
            value = json.loads(line).get(field)
        except (ValueError, AttributeError):
            return None
        if value is None or isinstance(value, str):
            return None
        shown = json.dumps(value)
        return f"{type(value).__name__} {shown[:40]}{'...' if len(shown) > 40 else ''}"

    return _first_line(path, non_string)


def _name_bad_files(ds, source: SourceConfig):
    """``ds`` with its table generator wrapped in ``_NamedTables``; shards and shuffles of it keep the wrapper."""
    ex = getattr(ds, "_ex_iterable", None)
    if ex is not None and callable(getattr(ex, "generate_tables_fn", None)):
        ex.generate_tables_fn = _NamedTables(ex.generate_tables_fn, source)
    return ds


def source_identity(source: SourceConfig, base=None) -> dict:
    """What a resumed stream must find unchanged in its source, cheaply: the text field and, for local files,
    each file's path below the files' common folder and its size, in reading order (not that folder itself,
    so that a copy elsewhere still resumes; SlimPajama repeats file names across its chunk folders);
    for the Hub the dataset, config, split, revision (the one asked for, else the commit the stream resolved)
    and shard count. ``None`` marks what cannot be known here, and is not compared."""
    out: dict = {"kind": source.kind, "describe": source.describe(), "text_field": source.text_field}
    if source.kind in ("files", "embedded"):
        files = resolve_files(source.paths) if source.kind == "files" else [str(embedded_file(source.split))]
        folders = [os.path.dirname(os.path.abspath(f)) for f in files]
        root = os.path.commonpath(folders) if folders else ""
        out["files"] = [[os.path.relpath(os.path.abspath(f), root), os.stat(f).st_size] for f in files]
        return out
    out.update(dataset=source.path, name=source.name, split=source.split,
               revision=source.revision or _resolved_revision(base),
               num_shards=None if base is None else int(base.num_shards))
    return out


def _resolved_revision(base) -> str | None:
    """The commit a hub stream resolved to, read from its data file URLs (``...@<sha>/...``); None if not found."""
    import re

    try:
        kwargs = base._ex_iterable.kwargs
        urls = [str(u) for v in kwargs.values() if isinstance(v, (list, tuple)) for u in v]
    except Exception:
        return None
    found = {m.group(1) for u in urls for m in [re.search(r"@([0-9a-f]{40})(?:/|$)", u)] if m}
    return found.pop() if len(found) == 1 else None


def documents(source: SourceConfig) -> Iterator[str]:
    """Plain-text documents of ``source`` in a fixed order."""
    if source.kind == "embedded":
        yield from embedded_documents(source.split)
        return
    stream = open_stream(source)
    try:
        for record in stream:
            yield _text(record, source)
    except (KeyError, ConnectionError, DataSourceError):
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
    bad = next((t for t in texts if not isinstance(t, str)), None)
    if bad is not None:
        raise DataSourceError(f"a record of {source.describe()} holds {type(bad).__name__} {str(bad)[:40]!r} in field "
                              f"{source.text_field!r}, where text must be a string; repair or remove that record.")
    return texts


def _text(record: dict, source: SourceConfig) -> str:
    text = record.get(source.text_field)
    if text is None:
        raise KeyError(f"records of {source.describe()} have no field {source.text_field!r}; set text_field.")
    if not isinstance(text, str):
        raise DataSourceError(f"a record of {source.describe()} holds {type(text).__name__} {str(text)[:40]!r} in "
                              f"field {source.text_field!r}, where text must be a string; repair or remove that record.")
    return text
