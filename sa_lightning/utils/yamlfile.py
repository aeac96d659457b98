"""The one reader of the YAML files a user writes: every command's ``--config`` and ``--preset`` file, a study's fit
config, a data config. A file that is not UTF-8, or whose YAML does not parse, is refused in one sentence that names
the file (and the flag that named it) with the line and column: ``--config study.yaml, line 2, column 6: expected ','
or ']', but got ':' (in the flow sequence that starts at line 1, column 10); fix the YAML there and run again.``
(PyYAML's own report is 60-70 lines of traceback naming ``"<unicode string>"``.)

A config value of the wrong type, reported by jsonargparse as a nested dump with the usage text, becomes one sentence
naming the key and where it was set (``config_value_error``)."""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any


def load_yaml(path: str | os.PathLike, flag: str | None = None) -> Any:
    """The YAML document in ``path`` (None for an empty file). ``flag`` (``--config``, ``--preset``, ``fit config``)
    heads the file's name in a refusal. A missing or unreadable file raises the system's ``OSError`` (one line from
    the shell, naming the path); text that is not UTF-8, or YAML that does not parse, a ``ValueError`` naming the
    file, the line and the column."""
    import yaml

    name = f"{flag} {path}" if flag else str(path)
    data = Path(path).read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ValueError(f"{name}: not UTF-8 text (byte {err.object[err.start]:#04x} at {err.start}); save the file "
                         "as UTF-8 (a YAML config is text) and run again.") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise ValueError(yaml_error(name, err)) from None


def yaml_error(name: str, err: Exception) -> str:
    """PyYAML's error (its problem, where, and the construct it was in) as one sentence headed by ``name``."""
    mark, problem = getattr(err, "problem_mark", None), getattr(err, "problem", None)
    context, context_mark = getattr(err, "context", None), getattr(err, "context_mark", None)
    if problem is None:  # not a marked error: its first line
        problem = (str(err).strip().splitlines() or [type(err).__name__])[0]
    where = f", line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    started = ""
    if context and context_mark is not None and (mark is None or (context_mark.line, context_mark.column) !=
                                                 (mark.line, mark.column)):
        started = (f" ({context.removeprefix('while parsing ').removeprefix('while scanning ')} that starts at line "
                   f"{context_mark.line + 1}, column {context_mark.column + 1})")
        started = started.replace("(a ", "(the ", 1)
    elif context:
        started = f" ({context})"
    return f"{name}{where}: {' '.join(problem.split())}{started}; fix the YAML there and run again."


def sets_key(path: str | os.PathLike, key: str) -> bool:
    """Whether the YAML file ``path`` sets ``key`` at any depth (under ``init_args`` too); False where it cannot be
    read."""
    def has(node) -> bool:
        return isinstance(node, dict) and (key in node or any(has(v) for v in node.values()))

    try:
        return has(load_yaml(path))
    except (OSError, ValueError):
        return False


def config_value_error(message: str, argv: list[str], command: str, where: str | None = None) -> str:
    """jsonargparse's report of a bad config value (``Parser key "data": ... Parser key "batch_size": Expected a
    <class 'int'>. Got value: four``, or a union's ``- Expected a <class 'float'> ... Given value: four``) as one
    sentence: the key's path, what it expected and got, and where it was set: ``where`` if given, else the flag on
    ``argv`` that names the key, else the last ``--config`` file on ``argv`` that sets it. A report of another kind:
    its first lines, then ``(<command> --help lists every option)``."""
    lines = [line.strip().removeprefix("- ") for line in message.splitlines() if line.strip()]
    # nested reports name one key per level ("data", then "batch_size"); others the whole path ("model.arch.n_layer")
    keys = [part for line in lines if (m := re.match(r'Parser key "([^"]+)"', line)) for part in m.group(1).split(".")]
    types = [m.group(1) for line in lines if (m := re.match(r"Expected a <class '([^']+)'>", line))]
    got = next((m.group(1) for line in lines if (m := re.search(r"(?:Got|Given) value: (.*)$", line))), None)
    types = [t for t in dict.fromkeys(types) if t != "NoneType"]
    if not keys or not types or got is None:
        return " ".join(lines[:3]) + f" ({command} --help lists every option)"
    said = f"expected {' or '.join(types)}, got {got}"
    if where is None:  # a flag that names the key and gives that value; else the last config file that sets the key
        given = [(a.split("=")[0], a.split("=", 1)[1] if "=" in a else argv[i + 1] if i + 1 < len(argv) else "")
                 for i, a in enumerate(argv) if a.startswith("--")]
        flag = next((name for name, value in reversed(given) if (name.endswith("." + keys[-1]) or
                                                                  name == "--" + keys[-1]) and got in value), None)
        configs = [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--config"] + [
            a.split("=", 1)[1] for a in argv if a.startswith("--config=")]
        where = f"the flag {flag}" if flag else next((path for path in reversed(configs) if sets_key(path, keys[-1])),
                                                      "a config or the command line")
    return f"{'.'.join(keys)}: {said} (set in {where})."


def check_yaml_arguments(argv: list[str], flags: tuple[str, ...] = ("--config", "--preset")) -> None:
    """Read every YAML file that ``argv`` names, before a parser does (whose report of a syntax error names no file):
    the value of each of ``flags`` that is a file, and any other flag's value that is a ``.yaml``/``.yml`` file (a
    fit's ``--model configs/model/sa.yaml``). The first that cannot be parsed is refused (``load_yaml``)."""
    for i, arg in enumerate(argv):
        flag, eq, value = arg.partition("=")
        if not flag.startswith("--"):
            continue
        value = value if eq else (argv[i + 1] if i + 1 < len(argv) else "")
        if not value or (flag not in flags and not value.endswith((".yaml", ".yml"))) or not Path(value).is_file():
            continue
        load_yaml(value, flag)
