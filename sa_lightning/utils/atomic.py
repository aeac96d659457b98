"""Files that are either whole or absent: every result, table, figure and checkpoint the project writes.

A file is written under a hidden temporary name in its own folder (``.<name>.<pid>.partial``), flushed
to disk, then renamed onto its final name with ``os.replace``. On one file system that rename is atomic:
a reader, or a run killed at any instant, sees the old file or the new one, never a truncated mix. The
temporary file never leaves the target's folder, so nothing is left in ``/tmp`` and no copy across file
systems ever overwrites a good file in place (what a move from ``/tmp`` onto a cluster's shared disk does).

An ``OSError`` while writing (a full disk, a read-only or missing folder) removes the partial file and is
raised again as a ``WriteError``: one sentence that names the file and says the old one is intact.

A set of files written together (a sweep's or a study's tables and figures, an analysis's CSV and PNG) is built
in a hidden folder beside them and moved into place only once all of it is written (``replacing_files``); a
whole folder that one command owns (an exported model) is built beside it and swapped in (``replacing_folder``).
"""
from __future__ import annotations

import contextlib
import gzip
import json
import os
import shutil
from pathlib import Path
from typing import Iterator

PARTIAL = ".partial"


class WriteError(OSError):
    """An ``OSError`` whose message is one sentence naming the file (what ``cli.py`` prints as ``error: ...``)."""

    def __init__(self, errno_: int | None, sentence: str, filename: str | None = None):
        super().__init__(errno_, sentence, filename)
        self.sentence = sentence

    def __str__(self) -> str:
        return self.sentence


def partial_path(path: str | os.PathLike) -> Path:
    """The hidden name ``path`` is written under before it is renamed into place (one per process); it keeps
    ``path``'s suffix, so writers that read the format from it (``savefig``) work unchanged."""
    path = Path(path)
    return path.with_name(f".{path.stem}.{os.getpid()}{PARTIAL}{path.suffix}")


def describe_os_error(err: OSError, what: str = "file") -> str:
    """``No space left on device`` etc. with the path: the part of a sentence every write error shares."""
    reason = (os.strerror(err.errno) if isinstance(err, WriteError) and err.errno else err.strerror) \
        or type(err).__name__  # a WriteError's strerror is its whole sentence
    where = err.filename if err.filename is not None else "?"
    return f"the {what} {str(where)!r} could not be written ({reason})"


def _fsync_folder(folder: Path) -> None:
    """Make the rename itself durable; some file systems (and all of Windows) cannot open a folder: skip."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def remove_stale_partials(folder: str | os.PathLike) -> list[Path]:
    """Delete ``.<name>.<pid>.partial`` files in ``folder`` left by a process that no longer runs (a
    ``kill -9`` mid-write). Files of a live process are kept: it may be writing them now."""
    removed = []
    folder = Path(folder)
    if not folder.is_dir():
        return removed
    for p in folder.glob(f".*{PARTIAL}*"):
        pid = p.name.rsplit(PARTIAL, 1)[0].rsplit(".", 1)[-1]
        if not pid.isdigit() or (int(pid) != os.getpid() and _alive(int(pid))):
            continue
        with contextlib.suppress(OSError):
            p.unlink()
            removed.append(p)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@contextlib.contextmanager
def replacing(path: str | os.PathLike, what: str = "file", fsync: bool = False) -> Iterator[Path]:
    """Yield a temporary path (``partial_path``) to write ``path``'s new content to; on success it replaces
    ``path`` at once.

    On any error the temporary file is removed and ``path`` keeps its old content; an
    ``OSError`` becomes a one-sentence ``WriteError``. ``fsync=True`` flushes the file and the rename to
    disk (checkpoints: a power cut then leaves the old file or the new one, too).
    """
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise WriteError(err.errno, f"{describe_os_error(err, 'folder')} for {str(path)!r}; pass a folder that "
                         "can be created and written.", err.filename) from None
    tmp = partial_path(path)
    try:
        yield tmp
        if fsync:
            with open(tmp, "rb+") as fh:
                os.fsync(fh.fileno())
        os.chmod(tmp, 0o666 & ~_umask())  # a temporary file may be private (0600): the result is not
        os.replace(tmp, path)
        if fsync:
            _fsync_folder(path.parent)
    except BaseException as err:
        written = tmp.stat().st_size if tmp.exists() else 0
        with contextlib.suppress(OSError):
            tmp.unlink()
        err = _stream_writer_error(err, path, written)
        if isinstance(err, OSError) and not isinstance(err, WriteError):
            err.filename = str(path) if err.filename in (None, str(tmp)) else err.filename
            raise WriteError(err.errno, f"{describe_os_error(err, what)}; nothing was replaced, the previous "
                             f"{what} there (if any) is intact; free space or pass a writable folder, then run "
                             "again.", str(path)) from None
        raise


def _stream_writer_error(err: BaseException, path: Path, written: int) -> BaseException:
    """torch's zip writer reports a failed write (a full disk) as a ``RuntimeError`` from ``inline_container.cc``
    ("unexpected pos", "PytorchStreamWriter failed writing file"), safetensors as a ``SafetensorError`` ("... (os
    error 28)"): the ``OSError`` each stands for (for torch's, ENOSPC where the disk has less room left than the
    file had reached), so that it ends in one sentence like any other."""
    import errno

    text = str(err)
    if type(err).__name__ == "SafetensorError" and "os error" in text:  # safetensors: "... (os error 28)"
        code = int(text.rsplit("os error", 1)[1].strip(" )") or 0) or errno.EIO
        return OSError(code, os.strerror(code), str(path))
    if not isinstance(err, RuntimeError) or not ("inline_container" in text or "PytorchStreamWriter" in text):
        return err
    try:
        full = shutil.disk_usage(path.parent).free <= max(written, 1 << 20)
    except OSError:
        full = False
    code = errno.ENOSPC if full else errno.EIO
    return OSError(code, os.strerror(code), str(path))


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def check_output_folder(folder: str | os.PathLike, flag: str = "--out", replaces: bool = False) -> Path:
    """``folder`` as a Path, refused in one sentence when it is empty (an unset shell variable) or the file
    system's root; when the whole folder is to be replaced (``replaces``), also the home folder and the current
    folder or one above it, which hold the user's other files."""
    if not str(folder).strip():
        raise ValueError(f"{flag} is empty (an unset shell variable?); name the folder to write.")
    path = Path(folder).expanduser()
    resolved, here = path.resolve(), Path.cwd().resolve()
    mine = replaces and (resolved == Path.home().resolve() or resolved in (here, *here.parents))
    if resolved == Path(resolved.anchor) or mine:
        raise ValueError(f"{flag} {str(folder)!r} is {resolved}, which holds more than this output: name a folder "
                         "of its own, e.g. outputs/<name>.")
    return path


#: the folder inside a sweep's ``--out`` that ``cli.py submit sweep`` writes its job script into and SLURM the jobs'
#: logs (``slurm-<job>_<task>.out``): the sweep's own, so that the array's tasks and the report job take that folder
SUBMIT_FOLDER = "slurm"


def check_results_folder(folder: str | os.PathLike, what: str, flag: str = "--out",
                         overwrite: bool | None = None) -> Path:
    """A folder that a resumable command (a sweep, a study, an evaluation) fills cell by cell: empty, new, or one
    that it wrote before (it holds ``cells/``), or one that ``cli.py submit`` made for it (it holds only
    ``SUBMIT_FOLDER``). A folder of other files is refused in one sentence, since the
    command's tables and figures would land among them and replace any of the same name; a command that takes
    ``--overwrite`` (``overwrite`` not None) writes there when it is given, replacing only its own names."""
    path = check_output_folder(folder, flag)
    if path.exists() and not path.is_dir():
        raise ValueError(f"{flag} {str(folder)!r} is a file; name a folder.")
    kind = path / "cells" / CELLS_KIND
    if kind.is_file() and kind.read_text().strip() != what:
        raise ValueError(f"{flag} {str(folder)!r} holds the cells of a {kind.read_text().strip()}, not of a {what}; "
                         f"name another folder for the {what} (nothing there was touched).")
    ours = {".run.lock", MANIFEST, OWNER}  # what a run interrupted before its first cell leaves behind
    # (and an array task's lock of its own cells, ``.run.lock.<digest>``, taken beside the others; and the folder
    # that ``cli.py submit`` keeps its job script and SLURM's logs in, there before the array's first task starts)
    if path.is_dir() and not (path / "cells").is_dir() and any(
            p.name not in ours and not p.name.startswith(".run.lock.")
            and not (p.name == SUBMIT_FOLDER and p.is_dir()) for p in path.iterdir()) \
            and not overwrite:
        also = "" if overwrite is None else \
            " or pass --overwrite to write beside them (files with the names it writes are replaced, whoever wrote them;"\
            " nothing else there is touched)"
        raise ValueError(f"{flag} {str(folder)!r} holds other files and no {what} of its own (no cells/ folder); "
                         f"name an empty or new folder for the {what}{also}.")
    return path


def output_folder(text: str) -> Path:
    """An argparse ``type`` for an output folder (``check_output_folder``), its refusal in argparse's one line."""
    import argparse

    try:
        return check_output_folder(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err).replace("--out ", "", 1)) from None


#: the hidden file a folder that one command owns carries (``replacing_folder``): which command wrote it, so that
#: ``--overwrite`` replaces only a folder of its own
OWNER = ".written_by"


def add_overwrite(parser) -> None:
    """``--overwrite`` for a command that writes a set of files into a folder the user names."""
    parser.add_argument("--overwrite", action="store_true",
                        help="replace files of the same names in --out that this project did not write there (the "
                             "user's own, or an older version's); without it they are refused and kept")


def check_replaceable_folder(folder: str | os.PathLike, overwrite: bool, flag: str = "--out", inputs=(),
                             owner: str | None = None) -> Path:
    """``folder`` as a Path that ``replacing_folder`` may replace: ``check_output_folder``'s refusals, a file, and
    a folder that holds files unless ``overwrite``, each in one sentence (callers check before long work). Even
    with ``overwrite``, a folder is never replaced that holds one of ``inputs`` (what the command reads), a
    checkpoint, or anything ``owner`` (the command) did not write itself (it carries no ``OWNER`` file naming it)."""
    path = check_output_folder(folder, flag, replaces=True)
    if path.exists() and not path.is_dir():
        raise ValueError(f"{flag} {str(folder)!r} is a file; name a folder.")
    if not path.is_dir() or not any(path.iterdir()):
        return path
    if not overwrite:
        raise ValueError(f"{flag} {str(folder)!r} already holds files; pass --overwrite to replace that folder, or "
                         "name another.")
    resolved = path.resolve()
    for given in inputs:
        if resolved in (Path(given).resolve(), *Path(given).resolve().parents):
            raise ValueError(f"{flag} {str(folder)!r} holds {str(given)!r}, the input being read; --overwrite never "
                             "replaces it: name another folder.")
    kept = next((p for p in path.rglob("*.ckpt")), None)
    if kept is not None:
        raise ValueError(f"{flag} {str(folder)!r} holds the checkpoint {str(kept)!r}; --overwrite never replaces a "
                         "folder with checkpoints in it: name another folder.")
    mark = path / OWNER
    written = mark.read_text().split("\n") if mark.is_file() else []
    if owner is not None:
        others = sorted(str(p.relative_to(path)) for p in path.rglob("*") if p.is_file() and p != mark
                        and str(p.relative_to(path)) not in written[1:])
        if not written or written[0].strip() != owner or others:
            extra = f" ({', '.join(map(repr, others[:3]))}{' and more' if len(others) > 3 else ''})" \
                if written and written[0].strip() == owner else ""
            raise ValueError(f"{flag} {str(folder)!r} holds files that `cli.py {owner}` did not write{extra}; "
                             "--overwrite replaces only a folder of its own: name another folder (or empty that "
                             "one yourself).")
    return path


@contextlib.contextmanager
def replacing_folder(folder: str | os.PathLike, what: str = "folder", overwrite: bool = False,
                     flag: str = "--out", inputs=(), owner: str | None = None) -> Iterator[Path]:
    """Yield a temporary folder beside ``folder`` to build its new content in; on success the new folder takes
    its place at once (the old one, when ``overwrite``, is moved aside and then removed).

    ``folder`` is checked first (``check_replaceable_folder``). On any error the temporary folder is removed and ``folder`` is left as it was; an
    ``OSError`` (a full disk) becomes a one-sentence ``WriteError``."""
    import shutil

    folder = check_replaceable_folder(folder, overwrite, flag, inputs, owner)
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        tmp = folder.parent / f".{folder.name}.{os.getpid()}{PARTIAL}"
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir()
    except OSError as err:
        raise WriteError(err.errno, f"{describe_os_error(err, 'folder')} for {str(folder)!r}; pass a folder that "
                         "can be created and written.", err.filename) from None
    old = folder.parent / f".{folder.name}.{os.getpid()}.old"
    try:
        yield tmp
        if owner is not None:  # the command, then every file it wrote: --overwrite replaces nothing else
            files = sorted(str(p.relative_to(tmp)) for p in tmp.rglob("*") if p.is_file())
            (tmp / OWNER).write_text("\n".join([owner, *files]) + "\n")
        mode = 0o777 & ~_umask()
        for p in (tmp, *tmp.rglob("*")):  # temporary files are private (0600): the result is not
            os.chmod(p, mode if p.is_dir() else mode & 0o666)
        if folder.exists():
            os.replace(folder, old)
        os.replace(tmp, folder)
    except BaseException as err:
        shutil.rmtree(tmp, ignore_errors=True)
        if old.exists() and not folder.exists():
            os.replace(old, folder)  # the swap broke between its two renames: put the old folder back
        err = _stream_writer_error(err, folder, 0)
        if isinstance(err, OSError) and not isinstance(err, WriteError):
            raise WriteError(err.errno, f"{describe_os_error(err, what)}; nothing was replaced, the previous "
                             f"{what} {str(folder)!r} (if any) is intact; free space or pass a writable folder, "
                             "then run again.", str(folder)) from None
        raise
    shutil.rmtree(old, ignore_errors=True)


#: the hidden file in ``<out>/cells/`` that names the kind of run whose cells they are (a sweep, a study, an
#: evaluation), so that one kind never reports, replaces or prunes another's
CELLS_KIND = ".kind"

#: the hidden file that records which of a folder's files a command wrote (``replacing_files``): a file of the
#: same name that is not in it is the user's, and is replaced only with ``--overwrite``
MANIFEST = ".written_by.json"


def written_by(folder: Path) -> dict:
    """``{name: what wrote it}`` of the files in ``folder`` that a command of this project wrote (``MANIFEST``)."""
    try:
        found = json.loads((folder / MANIFEST).read_text())
        return found if isinstance(found, dict) else {}
    except (OSError, ValueError):
        return {}


def record_written(folder: Path, names: list[str], what: str) -> None:
    """Add ``names`` to ``folder``'s ``MANIFEST`` as written by ``what``."""
    write_text(folder / MANIFEST, json.dumps({**written_by(folder), **{name: what for name in names}}, indent=1,
                                             sort_keys=True))


def check_own_files(folder: str | os.PathLike, names, overwrite: bool, what: str = "results") -> None:
    """Refuse, in one sentence, to replace a file in ``folder`` named in ``names`` that no command of this project
    wrote there (``MANIFEST`` does not list it), unless ``overwrite``: the contract of every command that writes
    a set of files into a folder the user names. Commands call it before long work where they know their names;
    ``replacing_files`` calls it again before it moves anything in."""
    folder = Path(folder)
    if overwrite or not folder.is_dir():
        return
    owned = written_by(folder)
    theirs = sorted(n for n in names if (folder / n).exists() and n not in owned)
    if theirs:
        raise ValueError(f"{str(folder)!r} holds {', '.join(map(repr, theirs[:3]))}"
                         f"{' and more' if len(theirs) > 3 else ''}, which the {what} would replace and no command "
                         "of this project wrote there (or an older version that kept no record); pass --overwrite to "
                         "replace them, or name another folder. Nothing was replaced.")


@contextlib.contextmanager
def replacing_files(folder: str | os.PathLike, what: str = "results", overwrite: bool = False) -> Iterator[Path]:
    """Yield a new hidden folder inside ``folder`` (``.<what>.<pid>.<random>.partial``) to write a set of files
    in, each under its final name; when the block ends without an error, each file is renamed onto that name in
    ``folder`` (a folder of the set replaces the earlier one whole). The hidden folder is removed either way.

    ``folder`` may hold other files (a sweep's resumable ``cells/``, an earlier analysis): only the names the
    block wrote are replaced, and none of them before the whole set is written; a file of one of those names that
    no command of this project wrote (``check_own_files``) is refused unless ``overwrite``. The renames stay on one file
    system and take no space, so a failure while the set is built (a full disk, a plot that raises) leaves every
    earlier file whole; an ``OSError`` becomes a one-sentence ``WriteError`` naming the file in ``folder``. The
    random part keeps array jobs of one sweep on several nodes (equal pids) out of each other's folders; a
    ``kill -9`` mid-write may leave one behind, which nothing reads."""
    import shutil
    import tempfile

    folder = Path(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(PARTIAL, f".{what.replace(' ', '_')}.{os.getpid()}.", folder))
    except OSError as err:
        raise WriteError(err.errno, f"{describe_os_error(err, 'folder')} for the {what} in {str(folder)!r}; pass a "
                         "folder that can be created and written.", err.filename) from None
    try:
        try:
            yield tmp
        except OSError as err:
            where = Path(err.filename) if err.filename is not None else folder
            err.filename = str(folder / where.relative_to(tmp)) if where.is_relative_to(tmp) else str(where)
            raise WriteError(err.errno, f"{describe_os_error(err, what)}; nothing in {str(folder)!r} was replaced, "
                             f"its previous {what} (if any) is intact; free space or pass a writable folder, then run "
                             "again.", err.filename) from None
        names = sorted(p.name for p in tmp.iterdir())
        check_own_files(folder, names, overwrite, what)
        # recorded first: a kill between the renames never leaves a file of ours that looks like the user's
        record_written(folder, names, what)
        for name in names:  # a folder of the set (tb/), or one in the way of a file: the old one aside first,
            if (folder / name).exists() and ((tmp / name).is_dir() or (folder / name).is_dir()):  # removed with
                os.replace(folder / name, tmp / f"{name}{PARTIAL}")  # the hidden folder
        for name in names:
            os.replace(tmp / name, folder / name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def write_text(path: str | os.PathLike, text: str, what: str = "file") -> None:
    """``Path(path).write_text(text)``, atomically."""
    with replacing(path, what) as tmp:
        tmp.write_text(text)


def write_records(path: str | os.PathLike, records: list[dict], what: str = "records") -> None:
    """One JSON line per record, gzipped, atomically; no timestamp in the gzip header, so a rerun that holds the
    same records writes the same bytes (per-item records of a sweep cell or an evaluation)."""
    with replacing(path, what) as tmp, open(tmp, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as f:
        f.write("".join(json.dumps(record, separators=(",", ":")) + "\n" for record in records).encode())


def read_records(path: str | os.PathLike) -> list[dict]:
    """The records ``write_records`` wrote."""
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def savefig(fig, path: str | os.PathLike, **kwargs) -> None:
    """``fig.savefig(path, **kwargs)``, atomically (the format comes from ``path``'s suffix)."""
    with replacing(path, "figure") as tmp:
        fig.savefig(tmp, **kwargs)
