"""argparse types for counts and seeds: a bad value is refused while the command line is parsed, in one line
(``argument --seeds: must be an integer from 0 to 2**32 - 1, got -1``), before anything runs or is written."""
from __future__ import annotations

import argparse
import re


#: reStructuredText's admonitions, which read as a word and a colon in plain text
_ADMONITIONS = {"note": "Note", "warning": "Warning", "tip": "Tip", "important": "Important", "seealso": "See also",
                "deprecated": "Deprecated", "versionadded": "New in", "versionchanged": "Changed in"}


def _directive(match: re.Match) -> str:
    indent, name, rest = match.groups()
    word = _ADMONITIONS.get(name.lower())
    if word is None:  # a code block, a label, a comment: the line that opens it says nothing to a reader
        return ""
    return f"{indent}{word}: {rest}".rstrip() if rest else f"{indent}{word}:"


def _role(match: re.Match) -> str:
    text = match.group(1).strip()
    if text.startswith("~"):  # :class:`~a.b.C` shows as C
        text = text[1:].rsplit(".", 1)[-1]
    return f"`{text}`"


def plain(text: str | None) -> str | None:
    """Help text as a reader of a terminal sees it: reStructuredText from docstrings (ours and Lightning's) turned
    into plain text. ``code`` and roles (:class:`datetime.timedelta`, :meth:`~a.B.log`) become single backquotes
    (`code`), links (`text <url>`_) their text and address, directives (.. note::) a word and a colon or nothing."""
    if not text:
        return text
    text = re.sub(r"`{2}(.+?)`{2}", r"`\1`", text, flags=re.S)
    text = re.sub(r":(?:py:)?[a-z]+:`([^`<]*?)(?:\s*<[^>`]*>)?`", _role, text)
    text = re.sub(r"`([^`<]+?)\s*<([^>`]+)>`__?", r"\1 (\2)", text)
    return re.sub(r"^([ \t]*)\.\.[ \t]+([\w-]+)::?[ \t]*(.*)$", _directive, text, flags=re.M)


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """A command's help: its description and examples as written, each option's default after its help (unless
    the help already says it, or there is none to say), all of it plain text (``plain``)."""

    def _get_help_string(self, action):
        text = plain(action.help) or ""
        default = action.default
        # nothing to add where the help says it, where there is none (None), for a flag (its help says what it turns
        # on) and for a positional; a default of 0 is said (``default in (None, False)`` would take it for False)
        if ("default" in text or default is None or default is False or default == argparse.SUPPRESS
                or not action.option_strings or action.nargs == 0):
            return text
        if isinstance(default, (list, tuple)):
            shown = " ".join(map(str, default)) or "none"
        else:
            shown = default if str(default) else "none"
        return f"{text} (default: {shown})" if text else f"default: {shown}"

    def _format_text(self, text):
        return super()._format_text(plain(text))


def doc_help(doc: str) -> dict:
    """``argparse.ArgumentParser``'s description, epilog and formatter from a module docstring: its first paragraph,
    the rest (the examples, the details), as plain text (``plain``)."""
    first, _, rest = (plain(doc) or "").strip().partition("\n\n")
    return {"description": first, "epilog": rest.strip("\n").rstrip() or None, "formatter_class": HelpFormatter}


def _shown(value) -> str:
    return " ".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)


def preset_help(text: str, presets: dict[str, dict], key: str) -> str:
    """The help of an option that a command's ``--preset`` fills when it is not given: its sentence, then each
    preset's value as its default (``(default: from --preset: cpu 1; paper 16)``)."""
    values = "; ".join(f"{name} {_shown(preset[key])}" for name, preset in presets.items() if key in preset)
    return f"{text} (default: from --preset: {values})"


def positive_int(text: str) -> int:
    """Sizes, counts and lengths: >= 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def non_negative_int(text: str) -> int:
    """Counts where 0 means "none" (bootstrap iterations): >= 0."""
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def seed(text: str) -> int:
    """A random seed as ``torch.Generator.manual_seed`` and numpy take it: 0 to 2**32 - 1."""
    value = int(text)
    if not 0 <= value < 2**32:
        raise argparse.ArgumentTypeError(f"must be an integer from 0 to 2**32 - 1, got {value}")
    return value


def key_values(items: list[str]) -> dict[str, str]:
    """``--set KEY=VALUE`` items (repeatable) as ``{KEY: VALUE}``, the later winning; an item without ``=`` or a key is
    refused in one line, before anything runs."""
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SystemExit(f"error: --set takes KEY=VALUE (a fit argument without its dashes), got {item!r}.")
        out[key] = value
    return out


def task_limit(text: str) -> int | float:
    """``--limit`` (an evaluation's, a sweep's): a whole number of documents (>= 1), or a fraction of each task in
    (0, 1)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number of documents or a fraction below 1, got {text!r}") from None
    if not value > 0 or (value >= 1 and not value.is_integer()):
        raise argparse.ArgumentTypeError(f"must be a whole number of documents (>= 1) or a fraction of each task "
                                         f"in (0, 1), got {text}")
    return int(value) if value >= 1 else value
