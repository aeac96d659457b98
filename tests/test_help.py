"""Help that reads as text (issue 78): every command's and subcommand's ``--help`` found from the command table
(``sa_lightning.main.COMMANDS``) and from each parser's own choices (``analyze gates``, ``submit sweep``), run in
this process (the Lightning commands' texts as the package ships them, ``sa_lightning/help/``, which
``test_shipped_help_is_current`` keeps current). None may show reStructuredText markup; every option has a sentence
and says its default (a flag, a required option or a config file's loader need not); no run of three or more spaces
stands inside a sentence."""
from __future__ import annotations

import ast
import contextlib
import importlib
import io
import json
import re
from pathlib import Path

import pytest

from sa_lightning.main import CACHED_HELP, COMMANDS, SHIPPED_HELP, Group

ROOT = Path(__file__).resolve().parents[1]

#: reStructuredText a reader of plain text would see as noise: double backquotes, roles, directives
RST = re.compile(r"``[^`]+``|:(?:py:)?(?:class|func|meth|attr|mod|obj|ref|data|exc|const|doc):`[^`]*`|^\s*\.\. \S",
                 re.M)
#: an option's entry in argparse's layout: two spaces, the option (or a positional's name), then its help
ENTRY = re.compile(r"^  (-\S.*?|\{.*?\}|[a-z_][\w-]*)(?:\s{2,}(\S.*))?$")
#: a section's title (``options:``, a group's title): flush left, ending in a colon
TITLE = re.compile(r"^\S.*:$")


def _help_of(function, argv: list[str]) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
        function(argv)
    return out.getvalue()


def _choices(text: str) -> list[str]:
    """The words a command's first positional takes (``{a,b,c}`` in its usage), each a subcommand candidate."""
    usage = text.split("\n\n")[0]
    found = re.search(r"\{([\w,-]+)\}\s*$", usage)
    return found.group(1).split(",") if found else []


def all_helps() -> dict[str, str]:
    """``command [sub] --help`` -> its text, for every command of the table and every choice of a command's first
    positional that prints a help of its own."""
    from sa_lightning.main import main

    helps = {"": _help_of(main, ["--help"])}  # the command list, and each group's (``bench --help``)
    helps.update({name: _help_of(main, [name, "--help"]) for name, entry in COMMANDS.items() if isinstance(entry, Group)})
    for name, entry in COMMANDS.items():
        if name in CACHED_HELP:  # Lightning's parsers: the shipped text (seconds of imports each to print live)
            header, _, text = (ROOT / "sa_lightning" / SHIPPED_HELP / f"{name}.txt").read_text().partition("\n")
            assert json.loads(header)["key"], name
            helps[name] = text
            continue
        for sub, command in (entry.commands.items() if isinstance(entry, Group) else [(None, entry)]):
            label = " ".join(filter(None, (name, sub)))
            run = getattr(importlib.import_module(command.module), command.function)
            if command.whole_argv:
                continue  # LightningCLI, served above
            text = helps[label] = _help_of(run, ["--help"])
            for choice in _choices(text):
                other = _help_of(run, [choice, "--help"])
                if other != text and other.strip():
                    helps[f"{label} {choice}"] = other
    return helps


def entries(text: str) -> list[tuple[str, str]]:
    """(option, its help joined into one line) for every option and positional the help lists."""
    found, current, in_section = [], None, False
    for line in text.splitlines():
        if not line.strip():
            current, in_section = None, False
            continue
        if TITLE.match(line):
            current, in_section = None, True
            continue
        if not in_section:
            continue
        entry = ENTRY.match(line)
        if entry:
            current = [entry.group(1), entry.group(2) or ""]
            found.append(current)
        elif current is not None and line.startswith("   "):
            current[1] = f"{current[1]} {line.strip()}".strip()
        else:
            current = None  # a group's description, flush with the entries
    return [(option, help_) for option, help_ in found]


def _is_flag(option: str) -> bool:
    """An option that takes no value, or one whose value may be left out (``--print_config [=flags]``)."""
    last = option.split(", ")[-1]
    return " " not in last or (bool(re.search(r" \[[^\]]*\]$", last)) and "ITEM," not in last)


def _required(text: str) -> set[str]:
    """The options the usage line shows outside brackets (``--ckpt CKPT``, ``(--ckpt CKPT | --model MODEL)``):
    required, so they have no default to say."""
    usage = text.split("\n\n")[0]
    depth, word, found = 0, "", set()
    for char in usage + " ":
        if char == "[":
            depth += 1
        elif char == "]":
            depth -= 1
        if char in " []()|\n":
            if depth == 0 and word.startswith("-"):
                found.add(word)
            word = ""
        else:
            word += char
    return found


#: jsonargparse's suffix of an option's help, ``(required, type: int, default: 4)``
SUFFIX = re.compile(r"\((?:required|type|default)\b[^()]*(?:\([^()]*\)[^()]*)*\)\s*$")
#: a clause that says only the default: ``default: 32``, ``(default: the config's)``
DEFAULT_CLAUSE = re.compile(r"\(?\bdefault(?::|s to)[^;()]*?(?:\([^()]*\)[^;()]*?)*(?:\)|;|\.\s|$)", re.I)


def sentence(help_: str) -> str:
    """What an option's help says besides its type and default."""
    return DEFAULT_CLAUSE.sub(" ", SUFFIX.sub("", help_)).strip()


def problems(label: str, text: str) -> list[str]:
    wrong = [f"{label}: reStructuredText {m.group(0).strip()!r} in {text[max(0, m.start() - 40):m.end() + 40]!r}"
             for m in RST.finditer(text)]
    required = _required(text)
    for option, help_ in entries(text):
        if option in ("-h, --help",):
            continue
        if len(re.findall(r"[A-Za-zσ]{2,}", sentence(help_))) < 2:
            wrong.append(f"{label}: {option} has no sentence: {help_!r}")
        says_default = re.search(r"\bdefault|\brequired\b", help_, re.I)
        exempt = (not option.startswith("-") or _is_flag(option) or option.split()[0] in required
                  or "and exit" in help_  # a help action
                  or "configuration file" in help_)  # jsonargparse's loader of a config file: nothing unless given
        if not (says_default or exempt):
            wrong.append(f"{label}: {option} does not say its default: {help_!r}")
    for line in text.splitlines():
        body = line.lstrip()
        indented = body != line
        runs = list(re.finditer(r"\S( {3,})(?=\S)", body))
        example = body.startswith(("python ", "... "))
        if runs and (body[runs[-1].end():].startswith("#")
                     or example and not body[runs[-1].end():].startswith("-")):
            runs = runs[:-1]  # an example's aligned comment, or the column that says what it does
        if indented and not example and runs and runs[0].start() < 24:
            runs = runs[1:]  # a two-column line (an option and its help, a term and its meaning)
        if runs:
            wrong.append(f"{label}: a run of spaces inside a sentence: {line.strip()!r}")
    return wrong


@pytest.fixture(scope="module")
def helps(monkeypatch_module) -> dict[str, str]:
    return all_helps()


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("COLUMNS", "80")
        yield mp


def test_every_command_and_subcommand_has_a_help(helps):
    """The walk found every command of the table and the subcommands its parsers offer."""
    for name, entry in COMMANDS.items():
        for sub in (entry.commands if isinstance(entry, Group) else [None]):
            label = " ".join(filter(None, (name, sub)))
            assert helps.get(label, "").startswith("usage:"), (label, helps.get(label, "")[:300])
    assert {"analyze gates", "analyze attention-maps"} <= set(helps)


def test_help_reads_as_text(helps):
    """No reStructuredText, a sentence and a default for every option, no run of spaces inside a sentence."""
    wrong = [problem for label, text in helps.items() for problem in problems(label, text)]
    assert not wrong, f"{len(wrong)} problems:\n" + "\n".join(wrong)


def _written_strings(path: Path):
    """(line, text) of every string literal of a module that is not a docstring: what it prints or writes."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docs = {id(node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            yield node.lineno, node.value


def test_no_table_or_note_the_package_writes_holds_rst():
    """The tables and notes the experiments write (``table.md``'s notes: the long-range study's σ SD line held
    ``eval_seeds`` in double backquotes) are Markdown: code in single backquotes, no reStructuredText. Read from
    every string literal of the package that is not a docstring (a fenced code block's three backquotes are
    Markdown)."""
    wrong = [f"{path.relative_to(ROOT)}:{line}: {text[:100]!r}"
             for path in sorted((ROOT / "sa_lightning").rglob("*.py")) for line, text in _written_strings(path)
             if RST.search(text.replace("```", ""))]
    assert not wrong, "\n".join(wrong)


def test_the_checks_catch_each_fault():
    """The checker itself: each fault the issue met is caught, a clean help passes."""
    clean = ("usage: x [-h] [--n N] [--flag]\n\nx: does a thing.\n\noptions:\n  -h, --help  show this help\n"
             "  --n N       tokens per row (default: 4)\n  --flag      turn it on\n\n"
             "    python cli.py x --n 3   # three\n")
    assert problems("x", clean) == []
    assert problems("x", clean.replace("does a thing", "does ``a`` thing"))
    assert problems("x", clean.replace("does a thing", "does :class:`a` thing"))
    assert problems("x", clean.replace("tokens per row (default: 4)", "(type: int, default: 4)"))
    assert problems("x", clean.replace(" (default: 4)", ""))
    assert problems("x", clean.replace("--n 3   # three", "--n 3      --flag   # three"))  # evaluate's example
    assert problems("x", clean.replace("--n 3   # three", "--n 3      --flag"))
    assert problems("x", clean.replace("x: does a thing.", "x: does  a   thing."))
    assert problems("x", clean.replace("  --flag      turn it on\n", "  --flag      turn it on\n  --m M\n"))
