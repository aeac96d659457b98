"""The one experiment runner: a sweep, a study and an evaluation are each a grid of cells, a function that runs
one cell, and the comparisons made from the cells. What they share lives here:

- **the cell loop** (``run_cells``): each cell's record is written to ``<out>/cells/<id>.json`` (and its per-item
  records, if it returns any, to ``<id>.items.jsonl.gz`` first) as soon as it finishes, each file atomically; a
  rerun reuses every cell whose record holds this run's ``spec`` and whose items read back whole, and runs the rest
  (a damaged file, a record cut short, items cut short: one line says so and the cell runs again). With ``jobs`` > 1
  the cells go to worker processes, each with its share of the cores;
- **what makes a finished cell reusable**: its ``spec``, every input that shaped it. A model is named in it by
  ``fingerprint`` (its weights' bytes), never by its path, so a folder exported again in place with other weights
  is run again;
- **the seeds** (``unique_seeds``): a seed named twice counts once;
- **the output contract**: one lock per output folder (``folder_lock``: a second run into the same folder is refused
  in one sentence); SIGTERM, SIGINT and SIGHUP (``stopping``) stop every worker process at once, keep the cells
  already finished, and exit non-zero with one line (``Stopped``), never a traceback and never an orphaned worker
  still holding a run folder;
- the statistics are ``utils.stats``, the tables and figures ``utils.report``.
"""
from __future__ import annotations

import collections
import contextlib
import gzip
import hashlib
import json
import os
import queue
import signal
import sys
import threading
import time
import zlib
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from multiprocessing import get_context
from pathlib import Path
from typing import Callable, Iterator

from . import host
from .atomic import CELLS_KIND, read_records, remove_stale_partials, write_records, write_text
from .load import cores_available
from .runlock import RunLock

#: the lock file of an output folder (``folder_lock``)
LOCK_NAME = ".run.lock"
#: files larger than this are fingerprinted from samples of their bytes, not read whole
_WHOLE = 256 * 2**20
_SAMPLE = 2**20
#: the signals that stop a run
SIGNALS = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGINT", "SIGHUP") if hasattr(signal, name))


# ---- seeds and fingerprints -------------------------------------------------------------------------
def unique_seeds(seeds, what: str = "seeds") -> list[int]:
    """``seeds`` in their order, each once: the same seed twice is the same draw, and counting it twice would
    shrink a spread to nothing and inflate the count of seeds. One line says which were dropped. A seed outside 0 to
    2**32 - 1 (what torch's and numpy's generators take, and Lightning's ``seed_everything``) is refused here,
    before any cell runs, not minutes into the first one."""
    out, again = [], []
    bad = [s for s in seeds if isinstance(s, bool) or not isinstance(s, int) or not 0 <= s < 2**32]
    if bad:
        raise ValueError(f"{what}: {', '.join(map(str, bad))} is not a seed; a seed is an integer from 0 to 2**32 - 1 "
                         "(torch's, numpy's and Lightning's generators take no other). Nothing was run.")
    for s in seeds:
        (again if s in out else out).append(s)
    if again:
        print(f"{what}: {', '.join(map(str, sorted(set(again))))} named more than once; each seed counts once "
              f"({', '.join(map(str, out))})", file=sys.stderr, flush=True)
    return out


def _file_digest(path: Path, h) -> None:
    size = path.stat().st_size
    h.update(f"{path.name}:{size}".encode())
    with open(path, "rb") as f:
        if size <= _WHOLE:
            for block in iter(lambda: f.read(2**22), b""):
                h.update(block)
            return
        for k in range(16):  # 16 MiB of a large file, spread evenly over it
            f.seek((size - _SAMPLE) * k // 15)
            h.update(f.read(_SAMPLE))


def fingerprint(path: str | os.PathLike) -> str:
    """A digest of what a file or a folder holds (each file's name, size and bytes; files over 256 MiB by 16
    samples of 1 MiB spread over them): what names a model or a checkpoint in a cell's spec."""
    path = Path(path)
    h = hashlib.sha256()
    def hidden(p: Path) -> bool:
        return any(part.startswith(".") for part in p.relative_to(path).parts)

    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file() and not hidden(p))
    for p in files:
        _file_digest(p, h)
    return h.hexdigest()[:16]


# ---- the output contract ----------------------------------------------------------------------------
def folder_lock(out: str | os.PathLike, what: str = "run") -> RunLock:
    """The output folder's lock, taken: a second run into ``out`` while this one runs is refused in one sentence
    (two runs writing one folder would replace each other's files). The system drops it when the process ends."""
    lock = RunLock(out, LOCK_NAME, what=what)
    lock.acquire()
    return lock


@contextlib.contextmanager
def cells_lock(out: str | os.PathLike, keys: list[str], what: str = "run") -> Iterator[None]:
    """Locks for a run that writes only ``keys``' cells and no report (a job array's task): the folder's lock
    shared, so that the array's other tasks, on other cells, run beside it while a whole run of the folder waits,
    and one lock of these cells' own, so that a second task on the same cells is refused in one sentence."""
    digest = hashlib.sha1("\n".join(sorted(keys)).encode()).hexdigest()[:12]
    with RunLock(out, LOCK_NAME, what=what, shared=True), RunLock(out, f"{LOCK_NAME}.{digest}", what=what):
        yield


class Stopped(SystemExit):
    """A run stopped by a signal: the exit status 128 + the signal's number (what a shell reports for it)."""

    def __init__(self, signum: int):
        super().__init__(128 + signum)
        self.signum = signum


@contextlib.contextmanager
def stopping() -> Iterator[None]:
    """Within the block, SIGTERM, SIGINT and SIGHUP raise ``Stopped`` in the main thread (where the runner waits),
    so that its ``finally`` stops the workers; the previous handlers come back after it."""
    def handler(signum, frame):
        for s in previous:  # a second signal while the workers are being stopped is not a second traceback
            signal.signal(s, signal.SIG_IGN)
        raise Stopped(signum)

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    # a signal the process was told to ignore (nohup's SIGHUP, a background job's SIGINT) stays ignored; one whose
    # handler was installed from C (getsignal gives None) is left alone too
    previous = {s: h for s in SIGNALS if (h := signal.getsignal(s)) not in (signal.SIG_IGN, None)}
    for s in previous:
        signal.signal(s, handler)
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


def stopped_line(err: Stopped, done: int, total: int, out: Path) -> str:
    name = signal.Signals(err.signum).name
    return (f"stopped by {name}: {done} of {total} cell(s) finished and kept in {out / 'cells'}; run the same command "
            "again to go on from there")


# ---- presets ----------------------------------------------------------------------------------------
def preset_values(presets: dict | None, preset: str, where: str, known=None) -> dict:
    """What ``--preset`` sets over a config, for every command that has presets (sweeps and studies): the config's
    ``presets[NAME]``, or a second YAML file (``--preset my_quick.yaml``) laid over the first. ``known``: the
    fields a preset may set; another is refused in one sentence, naming it."""
    from .yamlfile import load_yaml

    presets = presets or {}
    if preset in presets:
        values = presets[preset]
    elif str(preset).endswith((".yaml", ".yml")) and Path(preset).is_file():
        values = load_yaml(preset, "--preset") or {}
        if isinstance(values, dict):
            values.pop("presets", None)
    elif str(preset).endswith((".yaml", ".yml")):
        raise ValueError(f"--preset {preset}: no such file (from {Path.cwd()}); give the path of a YAML file of "
                         f"overrides, or one of {where}'s presets: {', '.join(presets) or 'it has none'}.")
    else:
        raise ValueError(f"unknown preset {preset!r}; {where} has {', '.join(presets) or 'no presets'} (or pass a "
                         "YAML file of overrides as --preset FILE.yaml).")
    if not isinstance(values, dict):
        raise ValueError(f"preset {preset!r} must be a mapping of config fields, got {type(values).__name__}.")
    unknown = sorted(set(values) - set(known)) if known is not None else []
    if unknown:
        raise ValueError(f"preset {preset!r} sets unknown field(s) {', '.join(unknown)} ({where}).")
    return values


def typed_settings(cls, settings: dict, where: str, layers: list[tuple[str, dict]] = ()) -> dict:
    """``settings`` (a config file's fields, its preset's and the command line's, merged) checked against the
    dataclass ``cls`` the way jsonargparse reads every other config of the CLI: each field's type, and no field
    that ``cls`` does not have. A wrong one is refused in one sentence naming ``where`` and the key; with ``layers``
    (``[(where, values), ...]``, the file, the preset, the flags), naming the layer that set it, even where a later
    one overrides it."""
    import copy
    import dataclasses

    from jsonargparse import ArgumentParser

    parser = ArgumentParser(exit_on_error=False)
    parser.add_class_arguments(cls, nested_key=None, fail_untyped=False)
    # the class's own fields first, then those every config of its kind shares (keyword-only)
    known = [f.name for f in sorted(dataclasses.fields(cls), key=lambda f: f.kw_only)]
    required = [f.name for f in dataclasses.fields(cls) if f.default is dataclasses.MISSING
                and f.default_factory is dataclasses.MISSING and settings.get(f.name) is not None]

    def parse(values: dict, said: str):
        unknown = sorted(set(values) - set(known))
        if unknown:
            raise ValueError(f"{said} sets unknown field(s) {', '.join(map(repr, unknown))}; its fields are "
                             f"{', '.join(known)}.")
        try:
            return parser.parse_object(copy.deepcopy({k: v for k, v in values.items() if v is not None}))
        except Exception as err:  # jsonargparse's ArgumentError: 'Parser key "seeds": Expected a <class 'int'>...'
            text = str(err)
            key = next((line.split('"')[1] for line in text.splitlines() if line.strip().startswith("Parser key")),
                       None)
            if key is None:
                raise ValueError(f"{said}: {text.splitlines()[0] if text else type(err).__name__}.") from None
            import re

            expected = re.search(r"Expected a <class '(\w+)'>", text)
            kind = expected.group(1) if expected else \
                str(next(f.type for f in dataclasses.fields(cls) if f.name == key)).replace(" | None", "")
            got = re.search(r"(?:Got|Given) value: (.*)", text)
            raise ValueError(f"{key}: expected {kind}, got {got.group(1).strip() if got else values.get(key)} "
                             f"(set in {said}).") from None

    for layer, values in layers:  # each layer alone (the required fields from the whole), so a refusal names it
        if values:
            parse({**{k: settings[k] for k in required}, **values}, layer)
    parsed = parse(settings, where)
    kept = {k: v for k, v in vars(parsed).items() if k in known}
    # a field that holds anything (``fit_overrides``: fit arguments) keeps its values as written: jsonargparse reads
    # a value naming a class_path (a callbacks list) into a Namespace, which prints as no fit argument (it parses a
    # copy, for it changes what it is given)
    loose = {f.name for f in dataclasses.fields(cls) if "Any" in str(f.type)}
    kept.update({k: settings[k] for k in loose if settings.get(k) is not None})
    return kept


# ---- cell files -------------------------------------------------------------------------------------
def items_file(record_path: Path) -> Path:
    return record_path.with_name(record_path.name[:-len(".json")] + ".items.jsonl.gz")


#: the cell files this process parsed, by name (a record, its per-item records): each once per run (a test counts)
PARSES: "collections.Counter[str]" = collections.Counter()


def read_cell(path: Path, needs: str | None = None, wanted: Callable[[dict], bool] = lambda saved: True) -> dict:
    """A finished cell's record with its per-item records in ``items`` (a list, parsed here once), or {} (run it)
    when there is none or it is damaged: a record cut short, one without ``needs`` (a key every record of this kind
    holds), or per-item records that do not read back whole or hold another count than the record says (the runner
    says so in one line). A record that ``wanted`` refuses (another spec) is returned without its items read: it
    runs again."""
    if not path.is_file():
        return {}
    try:
        saved = json.loads(path.read_text())
        PARSES[path.name] += 1
    except (OSError, ValueError, UnicodeDecodeError):
        saved = None
    whole = isinstance(saved, dict) and (needs is None or needs in saved)
    if whole and not wanted(saved):  # outside the try: ``wanted`` may refuse the folder in one sentence
        return saved
    try:
        ref = saved.get("items") if whole else None
        if isinstance(ref, dict) and "count" in ref:
            items = read_records(path.with_name(ref["file"]))  # a file cut short fails gzip's own length check
            PARSES[ref["file"]] += 1
            whole = len(items) == ref["count"]
            saved = {**saved, "items": items, "items_file": ref["file"]}
        if whole:
            return saved
    except (OSError, ValueError, EOFError, zlib.error, gzip.BadGzipFile, UnicodeDecodeError, TypeError, KeyError):
        pass
    return {}


def write_cell(path: Path, record: dict) -> dict:
    """The record as JSON, atomically; its ``items`` (a list) first, to ``<id>.items.jsonl.gz``, and named in the
    record by file and count, since the record is what marks the cell done. Returns the record as written."""
    items = record.get("items")
    if isinstance(items, list):
        write_records(items_file(path), items, "item records")
        record = {**record, "items": {"file": items_file(path).name, "count": len(items)}}
    write_text(path, json.dumps(record, indent=1))
    return record


def spec_digest(spec: dict) -> str:
    """Eight hex digits of a spec: a cell file name that differs whenever what made the cell does."""
    return hashlib.sha256(json.dumps(spec, sort_keys=True, default=str).encode()).hexdigest()[:8]


def prune_cells(out: Path, keep: list[str], kind: str) -> None:
    """Remove the cell files in ``<out>/cells`` whose id is not in ``keep`` (an earlier run's, once this run's
    set is in place): only in a ``cells/`` that ``run_cells`` marked as ``kind``'s, and only the runner's own names
    (``<id>.json``, ``<id>.items.jsonl.gz``)."""
    marked = out / "cells" / CELLS_KIND
    if not marked.is_file() or marked.read_text().strip() != kind:
        return
    names = {f"{k}.json" for k in keep} | {f"{k}.items.jsonl.gz" for k in keep}
    for p in (out / "cells").iterdir():
        if p.name not in names and (p.name.endswith(".json") or p.name.endswith(".items.jsonl.gz")):
            with contextlib.suppress(OSError):
                p.unlink()


class OtherRun(ValueError):
    """What a ``reuse`` rule raises for a record of another run (another model under the same patch): the runner
    names the record's file before the message and refuses the folder, before any cell runs."""


def same_spec(saved: dict, spec: dict) -> bool:
    """The one reuse rule: a finished cell's record stands for a cell exactly when its spec is equal."""
    return saved.get("spec") == spec


#: what ``made_otherwise`` says of a record in an earlier version's form
EARLIER = "a record of an earlier version"


def made_otherwise(saved: dict, spec: dict, key: str) -> str | None:
    """Where a record of this cell's place in the grid (its spec less ``key``) was made otherwise (``spec[key]``: a
    sweep's model, tokenizer, limit, ...): the settings that differ, in words; ``EARLIER`` where the record is in an
    earlier version's form (``key`` beside its spec, or a spec that names fewer settings than today's); None
    otherwise (the same record, or another place's)."""
    then, now = saved.get("spec"), spec
    if not isinstance(then, dict):
        return None
    if key in saved or not set(now) <= set(then) or (
            isinstance(then.get(key), dict) and not set(now[key]) <= set(then[key])):
        return EARLIER
    if {k: v for k, v in then.items() if k != key} != {k: v for k, v in now.items() if k != key}:
        return None
    then, now = then.get(key), now[key]
    if then == now:
        return None
    if not isinstance(then, dict) or not isinstance(now, dict):
        return f"{key} {then!r} (now {now!r})"
    return ", ".join(f"{k} {then.get(k)!r} (now {v!r})" for k, v in now.items() if then.get(k) != v)


def stands_for(saved: dict, spec: dict, reuse: Callable[[dict, dict], bool] = same_spec) -> bool:
    """Whether a record read back whole (``read_cell``) stands for the cell of ``spec``."""
    return bool(saved) and reuse(saved, spec)


# ---- the loop ---------------------------------------------------------------------------------------
def jobs_arg(text) -> int | str:
    """``--jobs``: a count >= 1, or ``auto``."""
    import argparse

    if str(text) == "auto":
        return "auto"
    if not str(text).isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"takes a count >= 1 or 'auto', got {text!r}")
    return int(text)


def plan_jobs(jobs: int | str | None, pending: int) -> tuple[int, int]:
    """(processes, threads each) for ``pending`` cells. ``auto`` (the default): one cell per core on a machine
    without a GPU, where a small model trains faster on one thread per process than on all of them in one (the
    pretrain study: 24 cells in 51 min as two one-thread processes on 2 cores, where the cells' one-thread times
    add up to about 1 h 42 min); one process where a GPU is, as its cells would share it."""
    jobs = jobs_arg(jobs if jobs is not None else "auto")
    if jobs == "auto":
        import torch

        jobs = 1 if torch.cuda.is_available() else cores_available()
    jobs = max(1, min(jobs, pending))
    return jobs, max(1, cores_available() // jobs)


def _start_worker(threads: int, pids, setup: Callable[[], None] | None) -> None:
    """A worker's start: a process group of its own (the runner stops it and whatever it started with one signal;
    a terminal's Ctrl-C reaches the runner only), death with its parent where Linux offers it, its share of the
    cores (and the processes it starts, through ``OMP_NUM_THREADS``), and the caller's ``setup``."""
    os.setpgrp()
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: a killed runner takes its workers along
    for s in SIGNALS:
        signal.signal(s, signal.SIG_DFL)
    pids.put(os.getpid())
    os.environ["OMP_NUM_THREADS"] = str(threads)
    import torch

    torch.set_num_threads(threads)
    if setup is not None:
        setup()


def _kill_workers(pids) -> None:
    """SIGKILL to each worker's process group: every cell file is written atomically, so nothing is cut short."""
    while True:
        try:
            pid = pids.get_nowait()
        except (queue.Empty, OSError, ValueError):
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)


def run_cells(cells: list, out: Path, cell_id: Callable[[object], str], spec_of: Callable[[object], dict],
              run: Callable[[object, dict], dict] | None, line: Callable[[dict], str],
              loaded: Callable[[dict], dict] = lambda saved: saved, jobs: int | str | None = 1,
              given: Callable[[object, dict, dict], dict] | None = None, setup: Callable[[], None] | None = None,
              needs: str | None = None, kind: str | None = None,
              reuse: Callable[[dict, dict], bool] = same_spec,
              announce: bool = False) -> list[dict]:
    """Every cell's record, in grid order, with its per-item records (``items``, a list): the one on disk when its
    ``spec`` is this run's (read once, ``read_cell``), else ``run(cell, spec)``'s, written as soon as it finishes
    (``write_cell``); ``loaded`` turns either into what the report takes (a study: integer keys; a sweep: its items
    as numbers). ``run`` None runs nothing: the records of the cells already done, the others left out (``--compare``).
    ``given(cell, saved, spec)`` may hand ``run`` more than the spec from an earlier record of the cell (a study's
    trained checkpoint); ``reuse(saved, spec)`` decides whether a record on disk stands for the cell (default: its
    spec is this one; it may refuse the folder in one sentence). With ``jobs`` > 1 (or ``auto``, ``plan_jobs``) the
    cells to run go to that many worker processes (``run`` and ``setup``, each worker's start, must then be
    module-level functions); a cell that fails stops the run once the cells in flight are written. One line for
    the plan (cells, done, to run), then one per cell as it finishes: its place in the grid, its id,
    ``line(record)``, its time and the run's so far; with ``announce`` (cells that take minutes), one as it
    starts. A signal stops every worker and exits in one line (``Stopped``), the finished cells kept."""
    if (out / "cells").is_dir():
        remove_stale_partials(out / "cells")
    mark = out / "cells" / CELLS_KIND
    if kind is not None and mark.is_file() and mark.read_text().strip() != kind:
        raise ValueError(f"{out} holds the cells of a {mark.read_text().strip()}, not of a {kind}; name another "
                         "folder (nothing there was touched).")
    # the folder and its mark come with the first cell written: a run refused before it writes nothing; a folder of
    # before (cells and no mark) stays unclaimed
    claim = kind is not None and not mark.is_file() and not any((out / "cells").glob("*.json"))
    start = time.perf_counter()
    results: dict[int, dict] = {}
    todo = []

    def finish(i: int, cell, result: dict, status: str) -> None:
        results[i] = result
        print(f"[{i}/{len(cells)}] {cell_id(cell)}: {line(result)} ({status}; "
              f"{time.perf_counter() - start:.0f} s so far)", flush=True)

    here = host.machine()  # what each record names; the threads are the run's own (below)

    def keep(i: int, cell, path: Path, record: dict) -> None:
        nonlocal claim
        path.parent.mkdir(parents=True, exist_ok=True)
        if claim:
            write_text(mark, kind + "\n")
            claim = False
        written = json.loads(json.dumps(write_cell(path, {**record, "machine": record.get("machine") or here})))
        if isinstance(record.get("items"), list):  # handed on as a rerun reads them back, not read again
            written.update(items=json.loads(json.dumps(record["items"])), items_file=written["items"]["file"])
        finish(i, cell, loaded(written), f"{record.get('seconds', 0.0):.0f} s")

    def wanted(path: Path, spec: dict) -> Callable[[dict], bool]:
        def check(saved: dict) -> bool:
            try:
                return reuse(saved, spec)
            except OtherRun as err:
                raise ValueError(f"{path} {err}") from None
        return check

    again = 0
    for i, cell in enumerate(cells, 1):
        path, spec = out / "cells" / f"{cell_id(cell)}.json", spec_of(cell)
        saved = read_cell(path, needs, wanted=wanted(path, spec))
        if path.is_file() and not saved:
            print(f"{path} is damaged (cut short?); " + ("running that cell again" if run is not None else
                  "left out (run the same command without --compare to run it again)"), flush=True)
        if stands_for(saved, spec, reuse):  # allowed across machines, and said: a seed's value may differ there
            elsewhere = saved.get("machine") and not host.same_machine(saved["machine"], here)
            finish(i, cell, loaded(saved),
                   f"done before on another machine: {host.describe(saved['machine'])}" if elsewhere else "done before")
        elif run is not None:
            again += path.exists()
            todo.append((i, cell, path, spec, given(cell, saved, spec) if given else spec))
    processes, threads = plan_jobs(jobs, len(todo)) if todo else (1, 1)
    if run is None:
        print(f"{len(cells)} cells, {len(results)} done, none run (--compare)", flush=True)
        return [results[i] for i in sorted(results)]
    print(f"{len(cells)} cells, {len(results)} already done, {len(todo)} to run"
          + (f" ({again} of them again: written with another spec, without per-item records, or damaged)"
             if again else "")
          + (f", {processes} at a time ({threads} thread(s) each)" if processes > 1 else ""), flush=True)
    if processes > 1:
        here["threads"] = threads
    try:
        with stopping():
            if processes == 1:
                for i, cell, path, spec, arg in todo:
                    if announce:
                        print(f"[{i}/{len(cells)}] {cell_id(cell)}: started", flush=True)
                    keep(i, cell, path, {**run(cell, arg), "spec": spec})
            else:
                _in_workers(todo, processes, run, setup, keep, threads,
                            (lambda i, cell: print(f"[{i}/{len(cells)}] {cell_id(cell)}: started", flush=True))
                            if announce else None)
    except Stopped as err:
        print(stopped_line(err, len(results), len(cells), out), file=sys.stderr, flush=True)
        raise
    return [results[i] for i in sorted(results)]


def _in_workers(todo: list, processes: int, run, setup, keep, threads: int, started=None) -> None:
    """The cells of ``todo`` in ``processes`` spawned workers, at most that many submitted at once (a failure
    stops the rest from starting); every worker is killed when this returns or raises (a signal included)."""
    ctx = get_context("spawn")
    pids = ctx.Queue()
    pool = ProcessPoolExecutor(processes, mp_context=ctx, initializer=_start_worker,
                               initargs=(threads, pids, setup))
    waiting, running, failed = list(todo), {}, None
    try:
        while waiting or running:
            while waiting and failed is None and len(running) < processes:
                i, cell, path, spec, arg = waiting.pop(0)
                running[pool.submit(run, cell, arg)] = (i, cell, path, spec)
                if started is not None:
                    started(i, cell)
            if not running:
                break
            done, _ = wait(running, timeout=0.5, return_when=FIRST_COMPLETED)
            for future in done:
                i, cell, path, spec = running.pop(future)
                if future.exception() is not None:
                    failed = failed or future.exception()  # the rest never start; those in flight finish
                    continue
                try:
                    keep(i, cell, path, {**future.result(), "spec": spec})
                except Exception as err:  # a cell that cannot be written: the others in flight still finish
                    failed = failed or err
    except BaseException:  # a signal, or the runner's own failure: no worker outlives it
        _kill_workers(pids)
        for process in list((getattr(pool, "_processes", None) or {}).values()):  # those still starting too
            with contextlib.suppress(Exception):
                process.kill()
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown(wait=True)
    if failed is not None:
        raise failed
