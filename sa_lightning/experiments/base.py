"""The Experiment type and its one entry.

An experiment is one file: a typed config (a dataclass, its presets in the YAML beside it), the grid of cells, the
cell function, the outcomes it scores and the comparisons, and its views (``Report``). ``main`` runs any of them
the same way: parse, settings, folder, lock, cells (``utils.runner.run_cells``: a finished cell is reused exactly
when its spec is equal), report, write. Every experiment writes the same files (``write_report``): ``table.md``,
``compare.md``, ``compare.json`` (one schema, ``utils.report.COMPARE_FIELDS``), ``results.json``, ``results.csv``, its
figures and any further views, beside ``cells/`` (``utils.report.RESULT_FILES``).
"""
from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from ..utils import runner
from ..utils.argtypes import doc_help
from ..utils.atomic import (check_own_files, check_results_folder, output_folder, replacing_files, write_text,
                            written_by)
from ..utils.report import RESULT_FILES, compare_json
from ..utils.runner import jobs_arg
from ..utils.tables import write_csv
from ..utils.yamlfile import load_yaml


@dataclass(frozen=True)
class Flag:
    """A command-line flag that overrides the config's field of the same name (``nargs`` ``+``: a list; a list
    flag also takes the list as one YAML value, ``--windows '[16, 32]'``)."""

    name: str
    help: str
    type: Callable[[str], Any] = str
    nargs: str | None = "+"
    choices: tuple | None = None


class OneLineParser(argparse.ArgumentParser):
    """A refusal while parsing is one line, the option named, not the usage text above it."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} ({self.prog} --help lists every option)\n")


@dataclass(frozen=True)
class Run:
    """How a run goes, the same flags for every experiment: ``compare`` runs no cell and reports those done;
    ``cells_only`` runs cells and writes no report (a SLURM array's task); ``overwrite`` writes into a folder that
    holds other files, replacing only files of the report's names."""

    compare: bool = False
    cells_only: bool = False
    overwrite: bool = False


def yaml_value(text: str):
    """A flag's value as YAML reads it (``16``, ``[16, 32]``, ``{a: 3}``, ``null``, ``true``), else the text."""
    import yaml

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def config_flags(config: type, skip: tuple[str, ...] = ()) -> tuple[Flag, ...]:
    """A flag for each field of a config dataclass (its help from the class's ``Args:`` docstring), each value read
    as YAML; the fields every experiment's parser has (``out``, ``jobs``) and ``skip`` left out."""
    import re

    doc = (config.__doc__ or "").split("Args:", 1)[-1]
    helps = {m.group(1): " ".join(m.group(2).split())
             for m in re.finditer(r"^\s{8}(\w+): (.*?)(?=^\s{8}\w+: |\Z)", doc, flags=re.M | re.S)}
    out = []
    for f in dataclasses.fields(config):
        if f.name in ("out", "jobs", *skip):
            continue
        kind = str(f.type)
        nargs = "+" if kind.startswith("list") else "?" if kind == "bool" else None
        out.append(Flag(f.name, helps.get(f.name, f"the config's {f.name}"), yaml_value, nargs))
    return tuple(out)


@dataclass
class Report:
    """What an experiment's records make. ``comparisons`` are ``compare.json``'s rows (``COMPARE_FIELDS``);
    ``rows`` are ``results.csv``'s and ``results.json``'s; ``figures`` draw each PNG (or a folder of logs, an
    evaluation's ``tb/``) into the path given (one that writes nothing had nothing to draw); ``views`` are further
    files (``reach.md``)."""

    table: str
    compare: str
    comparisons: list[dict]
    rows: list[dict]
    figures: dict[str, Callable[[Path], object]] = field(default_factory=dict)
    views: dict[str, str] = field(default_factory=dict)
    #: ``compare.json``'s and ``results.json``'s further tables, beside their rows (a sweep's ΔNLL by position, an
    #: evaluation's models)
    compare_extra: dict = field(default_factory=dict)
    results_extra: dict = field(default_factory=dict)
    #: what the command prints at the end instead of ``compare`` (a sweep's verdicts counted)
    summary: str | None = None
    #: ``results.csv``'s columns in their order (default: as the rows first name them)
    csv_fields: list[str] | None = None


class Experiment:
    """One experiment: subclass it, set the class attributes, write the methods; its module holds one instance,
    ``EXPERIMENT``. ``main`` runs each command on a copy of it (``cfg`` its config), so what a run finds out once
    (a loaded model, its checkpoints) sits on that run's copy from ``prepare`` to ``report``, never on
    ``EXPERIMENT``; ``run`` goes to worker processes where ``jobs`` is above 1 (the copy pickled), so an experiment
    that keeps such state runs its cells in this process (``jobs`` 1)."""

    #: the command, as a user types it after ``cli.py`` (``study long-range``)
    name: str = ""
    #: what its ``cells/`` hold (a study's folder never takes a sweep's cells)
    kind: str = "study"
    #: the typed config: a dataclass; its fields are what the YAML, a preset and the flags may set
    config: type = object
    config_file: str = ""
    #: the presets' note and the default output folders, for ``--help``
    presets_note: str = ""
    folders: str = ""
    flags: tuple[Flag, ...] = ()
    #: fields that must hold at least one entry
    required: tuple[str, ...] = ()
    #: a key every record of this experiment holds (a record without it is damaged and runs again)
    needs: str | None = None
    #: a line as each cell starts (cells that take minutes)
    announce: bool = False
    #: the names its report writes beside ``RESULT_FILES`` and whatever its figures draw (an evaluation's ``tb/``),
    #: checked before any cell: a file of the user's of one of them is refused before the work, not after
    writes: tuple[str, ...] = ()

    # ---- what each experiment writes -----------------------------------------------------------------
    def check(self, cfg, given: dict) -> None:
        """Refuse a bad config before any cell runs, and normalise it in place; ``given``: the fields the command
        line set."""

    def cells(self, cfg) -> list:
        raise NotImplementedError

    def cell_id(self, cell) -> str:
        """A cell's file name in ``cells/``: its ``key``."""
        return cell.key

    def spec(self, cell, cfg, out: Path) -> dict:
        """Every input that makes the cell: a record holding an equal spec stands for it."""
        raise NotImplementedError

    def run(self, cell, spec: dict) -> dict:
        raise NotImplementedError

    def line(self, record: dict) -> str:
        """A finished cell's line after its id."""
        return ""

    def loaded(self, saved: dict) -> dict:
        """A record as read back from JSON, turned into what ``run`` returned (integer keys, say)."""
        return saved

    def given(self, cell, saved: dict, spec: dict) -> dict:
        """What ``run`` gets: the spec, or more from an earlier record of the cell (a trained checkpoint)."""
        return spec

    def setup(self) -> None:
        """Each worker process's start."""

    def report(self, cfg, records: list[dict], out: Path) -> Report:
        raise NotImplementedError

    # ---- how a run goes (the defaults suit most) -------------------------------------------------------
    #: the flag that names the output folder, in refusals
    out_flag = "--out"
    #: once the report is written, remove the cells of ``cells/`` that this run's grid does not name (an evaluation's
    #: cells are named by a digest of their settings, so a run with other settings leaves the last set whole until
    #: its own is in place)
    prunes = False

    def parse(self, argv: list[str] | None):
        """The typed config, the preset's name and how the run goes (``Run``), from the command line."""
        args = self.parser().parse_args(argv)
        if args.config is None:  # its own config, or none where it is not at hand (a wheel ships no configs/)
            found = default_config(self.config_file)
            args.config = found if found and Path(found).is_file() else ""
        elif not Path(args.config).is_file():
            raise SystemExit(f"error: {self.name} config {args.config} not found.")
        if args.compare and args.cells_only:
            raise ValueError("--cells_only runs cells without the report and --compare writes the report without "
                             "running cells: pass one of them.")
        return self.settings(args), args.preset, Run(args.compare, args.cells_only, args.overwrite)

    def prepare(self, cfg) -> None:
        """What a run loads once its settings are known and its folder checked, before its cells are listed (the
        checkpoints an evaluation scores): a folder that cannot take the results is refused before any of it."""

    def lock(self, cfg, out: Path, todo: list):
        """The run's hold on its folder: the folder's lock (one run at a time)."""
        return runner.folder_lock(out, self.kind)

    def before(self, cfg, out: Path, todo: list) -> None:
        """What a run does once its folder is held, before the cells."""

    #: the spec's key that names what made a cell besides its place in the grid (a sweep's model, by its weights):
    #: a record of the same place made otherwise is another run's, and its folder is refused, not mixed into this
    #: run's tables
    provenance: str | None = None

    def reuse(self, saved: dict, spec: dict) -> bool:
        """The one reuse rule (``utils.runner.same_spec``): a record stands for its cell exactly when its spec is
        equal; one that differs only in its ``provenance`` refuses the folder (``runner.OtherRun``)."""
        differ = runner.made_otherwise(saved, spec, self.provenance) if self.provenance else None
        if differ == runner.EARLIER:
            raise runner.OtherRun(f"is {differ}: `python cli.py migrate {self.cfg.out}` brings the folder's cells to "
                                  "today's form once, keeping each that means the same today (or pass another "
                                  f"{self.out_flag} to start afresh).")
        if differ:
            raise runner.OtherRun(f"was made with other settings: {differ}; pass another {self.out_flag} (or remove "
                                  "that folder's cells/) so that no cell of another run is counted as this one's.")
        return runner.same_spec(saved, spec)

    def jobs(self, cfg):
        """Cells run at once (``--jobs``; None: auto); a config without ``jobs`` runs them in this process (what it
        loads once, a model or checkpoints, stays here)."""
        return getattr(cfg, "jobs", 1)

    def header(self, cfg, preset: str | None, out: Path, todo: list) -> str:
        """The run's first line."""
        return f"{self.name}{f' (preset {preset})' if preset else ''}: {len(todo)} cell(s), results in {out}/"

    # ---- the command line and the settings -----------------------------------------------------------
    def parser(self) -> argparse.ArgumentParser:
        """The one parser: the config (YAML), a preset, the flags of the config's fields, and ``Run``'s."""
        parser = OneLineParser(prog=f"cli.py {self.name}", **doc_help(self.description()))
        parser.add_argument("--config", help="the config (YAML): the settings the flags below override, and its "
                                             "presets; each flag's default below is this config's (default: " +
                                             (f"{self.config_file}, else none" if self.config_file else "none") +
                                             ": the flags and their defaults)")
        own = help_yaml(default_config(self.config_file))  # its own config, read once for the whole help
        named = ", ".join(own.get("presets") or {}) or "none found"
        parser.add_argument("--preset", help=f"a preset of the config ({self.presets_note}); the default config's: "
                                             f"{named}; its header says each")
        if "jobs" in {f.name for f in dataclasses.fields(self.config)}:
            parser.add_argument("--jobs", type=jobs_arg,
                                help="cells run at once, each in its own process with cores/jobs threads (default: "
                                     "the config's jobs, else auto: one per CPU core without a GPU, one with a GPU)")
        defaults = self.defaults(own)
        parser.add_argument("--out", type=output_folder,
                            help=f"output folder (default: {defaults.get('out')}, the config's out; each preset "
                                 f"has its own, so that a quick run never overwrites the full one: {self.folders})")
        for flag in self.flags:
            shown = defaults.get(flag.name)
            shown = " ".join(map(str, shown)) if isinstance(shown, list) else "null" if shown is None else shown
            said = "" if "(default" in flag.help else " (required)" if flag.name not in defaults else \
                f" (default: {shown})"
            parser.add_argument(f"--{flag.name}", nargs=flag.nargs, type=flag.type, choices=flag.choices,
                                const=True if flag.nargs == "?" else None, help=flag.help + said)
        on = {"nargs": "?", "const": True, "default": False, "type": yaml_value}
        parser.add_argument("--compare", **on, help="run no cell: write the report from the cells already done in "
                                                    "--out (an interim look at a long run)")
        parser.add_argument("--cells_only", **on, help="run the cells and write no report (a SLURM array's task "
                                                       "beside the array's others; its report job writes it)")
        parser.add_argument("--overwrite", **on, help="write into an --out that holds other files: files with the "
                                                      "report's names are replaced, yours of those names too; "
                                                      "nothing else there is touched")
        return parser

    def defaults(self, own: dict) -> dict:
        """Each field's value without a preset or a flag (for help): ``own`` (its default config's top level, as
        ``help_yaml`` reads it), else the dataclass's."""
        fields = {f.name: f.default if f.default is not dataclasses.MISSING else f.default_factory()
                  for f in dataclasses.fields(self.config)
                  if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING}
        return {**fields, **{k: v for k, v in own.items() if k != "presets"}}

    def description(self) -> str:
        import sys

        return sys.modules[type(self).__module__].__doc__ or ""

    def overrides(self, args: argparse.Namespace) -> dict:
        """The config fields the command line sets (None: not given); a list given as one YAML value is that list."""
        def given(flag: Flag):
            value = getattr(args, flag.name)
            return value[0] if flag.nargs == "+" and value and len(value) == 1 and isinstance(value[0], list) \
                else value

        return {"jobs": getattr(args, "jobs", None), "out": None if args.out is None else str(args.out),
                **{flag.name: given(flag) for flag in self.flags}}

    def settings(self, args: argparse.Namespace):
        """The typed config: the YAML's top level, then its preset (or a YAML file of overrides), then the flags."""
        return self.load(args.config, args.preset, self.overrides(args))

    def load(self, path: str | Path, preset: str | None = None, overrides: dict | None = None):
        """The typed config from a file, a preset and overrides (``load_config``)."""
        return load_config(self, path, preset, overrides or {})


def default_config(name: str) -> str:
    """An experiment's own config: from the working folder where it is there, else from this checkout's (a command
    run from another folder still finds it)."""
    if not name or Path(name).is_file():
        return name
    here = Path(__file__).resolve().parents[2] / name
    return str(here) if here.is_file() else name


def help_yaml(config: str) -> dict:
    """A config as help shows it: its mapping, or {} where there is none or it cannot be read (help must not fail)."""
    try:
        raw = load_yaml(config) if config else {}
    except (OSError, ValueError):
        return {}
    return raw if isinstance(raw, dict) else {}


def preset_names(config: str) -> list[str]:
    """The presets a config defines, in its order (none where it cannot be read)."""
    return list(help_yaml(config).get("presets") or {})


def load_config(experiment: Experiment, path: str | Path, preset: str | None, overrides: dict):
    """``experiment.config`` from the file's top level, then ``presets[preset]`` (or a second YAML file), then
    ``overrides`` (those not None): each field checked against its type, no unknown field; each ``required`` field
    holds an entry; then the experiment's own ``check``."""
    raw = (load_yaml(path, "--config") or {}) if path else {}
    if not isinstance(raw, dict):
        raise ValueError(f"--config {path}: a config is a mapping of fields (name: value), but this file holds a "
                         f"{type(raw).__name__}; write it as `field: value` lines.")
    presets = raw.pop("presets", {}) or {}
    values = copy.deepcopy(raw)
    chosen = runner.preset_values(presets, preset, str(path)) if preset else {}
    flags = {k: v for k, v in overrides.items() if v is not None}
    values.update({**chosen, **flags})
    needed = [f.name for f in dataclasses.fields(experiment.config) if f.default is dataclasses.MISSING
              and f.default_factory is dataclasses.MISSING and f.name not in values]
    if needed:
        raise ValueError(f"{experiment.name} needs {', '.join(needed)}: set {'them' if len(needed) > 1 else 'it'} in "
                         f"--config or as {', '.join('--' + n for n in needed)}.")
    where = (str(path) or "the command line") + (f" with preset {preset!r}" if preset else "")
    kept = runner.typed_settings(experiment.config, values, where, [
        (f"--config {path}", raw), (f"--preset {preset}", chosen),
        ("the command line" + (f" ({', '.join('--' + k for k in flags)})" if flags else ""), flags)])
    for key in experiment.required:
        if not kept.get(key):
            raise ValueError(f"{experiment.name} needs at least one entry in {key!r} ({path}).")
    cfg = experiment.config(**{k: v for k, v in kept.items() if k in values})
    if getattr(cfg, "jobs", None) is not None:
        try:
            jobs_arg(cfg.jobs)
        except argparse.ArgumentTypeError as err:
            raise ValueError(f"jobs {err} ({path}).") from None
    experiment.check(cfg, {k: v for k, v in overrides.items() if v is not None})
    return cfg


# ---- the one entry -------------------------------------------------------------------------------------
def main(experiment: Experiment, argv: list[str] | None = None):
    """Run ``experiment`` from its command line: every cell (reused where its spec is equal), then the report
    (``Run``: ``--compare`` runs no cell, ``--cells_only`` writes no report). Returns what it wrote, the same keys for
    every experiment: ``results.json``'s, ``table`` and ``compare`` (the markdown), ``comparisons`` and
    ``compare.json``'s further tables, and the cells' ``records`` (``--cells_only``: the records alone)."""
    cfg, preset, how = experiment.parse(argv)
    experiment = copy.copy(experiment)  # what this run finds out (a loaded model) stays on its own copy
    experiment.cfg = cfg
    out = check_results_folder(cfg.out, experiment.kind, experiment.out_flag, overwrite=how.overwrite)
    try:  # before any cell: a user's table.md
        check_own_files(out, [*RESULT_FILES, *experiment.writes], how.overwrite, experiment.kind)
    except ValueError as err:
        unclaimed = [n for n in experiment.writes if (out / n).exists() and n not in written_by(out)]
        if not unclaimed:
            raise
        raise ValueError(f"{err} Where an earlier {experiment.name} wrote {', '.join(unclaimed)} without recording it, "
                         f"`python cli.py migrate {out}` records it once.") from None
    experiment.prepare(cfg)
    todo = experiment.cells(cfg)
    lock = runner.cells_lock(out, [experiment.cell_id(c) for c in todo], experiment.kind) if how.cells_only \
        else experiment.lock(cfg, out, todo)  # an array's task: beside the array's other tasks, on cells of its own
    with lock:  # one run at a time in this folder
        print(experiment.header(cfg, preset, out, todo), flush=True)
        start = time.perf_counter()
        experiment.before(cfg, out, todo)
        records = runner.run_cells(todo, out, experiment.cell_id, lambda cell: experiment.spec(cell, cfg, out),
                                   None if how.compare else experiment.run, experiment.line, experiment.loaded,
                                   experiment.jobs(cfg), given=experiment.given, setup=experiment.setup,
                                   needs=experiment.needs, kind=experiment.kind, announce=experiment.announce,
                                   reuse=experiment.reuse)
        if how.compare and not records:
            raise ValueError(f"--compare reports the cells already done, and {out / 'cells'} holds none of this "
                             "config's; run it first (without --compare), or pass its --out.")
        if how.compare and len(records) < len(todo):
            print(f"an interim look: {len(records)} of {len(todo)} cells done; a pre-registered run's verdicts count "
                  "only once every cell has trained", flush=True)
        if how.cells_only:
            print(f"{experiment.name} --cells_only: {len(todo)} cells in {out / 'cells'}; the report comes from the "
                  f"report job (or `--compare` with the whole config)", flush=True)
            return {"records": records}
        report = experiment.report(cfg, records, out)
        names = write_report(out, experiment, cfg, report, how.overwrite)
        if experiment.prunes:  # cells named by a digest of their settings: an earlier run's others go
            runner.prune_cells(out, [experiment.cell_id(c) for c in todo], experiment.kind)
    views = [text for name, text in report.views.items() if name.endswith(".md")]
    print("\n" + "\n".join(text for text in (report.table, *views, report.summary or report.compare) if text))
    print(f"wrote {out}/{', '.join(names)} ({time.perf_counter() - start:.0f} s)")
    return {**results_json(experiment, cfg, report), "table": report.table, "compare": report.compare,
            "comparisons": report.comparisons, **report.compare_extra, "records": records}


def write_report(out: Path, experiment: Experiment, cfg, report: Report, overwrite: bool = False) -> list[str]:
    """The files every experiment writes, moved into place together (``utils.atomic.replacing_files``: a full disk
    or a figure that fails leaves the previous set whole, and ``cells/`` stays). Returns their names."""
    names = []
    # in its own folder (cells/); a user's file of one of these names only with --overwrite
    with replacing_files(out, f"{experiment.kind} report", overwrite=overwrite) as tmp:
        for name, text in {"table.md": report.table, "compare.md": report.compare, **report.views}.items():
            write_text(tmp / name, text)
            names.append(name)
        write_text(tmp / "compare.json", json.dumps(compare_json(experiment.name, report.comparisons,
                                                                 **report.compare_extra), indent=2, default=str))
        write_text(tmp / "results.json", json.dumps(results_json(experiment, cfg, report), indent=1, default=str))
        write_csv(tmp / "results.csv", report.rows,
                  fields=report.csv_fields or list(dict.fromkeys(k for r in report.rows for k in r)))
        names += ["compare.json", "results.json", "results.csv"]
        for name, draw in report.figures.items():
            draw(tmp / name)
            if (tmp / name).exists():
                names.append(name)
    return names


def results_json(experiment: Experiment, cfg, report: Report) -> dict:
    """``results.json``, one schema for every experiment: its name, its config, its rows, then its further tables."""
    return {"experiment": experiment.name, "config": config_dict(cfg), "rows": report.rows, **report.results_extra}


def config_dict(cfg) -> dict:
    return dataclasses.asdict(cfg) if dataclasses.is_dataclass(cfg) else dict(vars(cfg))
