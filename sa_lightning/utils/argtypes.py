"""argparse types for counts and seeds: a bad value is refused while the command line is parsed, in one line
(``argument --seeds: must be an integer from 0 to 2**32 - 1, got -1``), before anything runs or is written."""
from __future__ import annotations

import argparse
import re


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """A command's help: its description and examples as written, and each option's default after its help (unless
    the help already says it, or there is none to say)."""

    def _get_help_string(self, action):
        text = action.help or ""
        default = action.default
        if "default" in text or default in (None, False, argparse.SUPPRESS) or not action.option_strings:
            return text
        shown = " ".join(map(str, default)) if isinstance(default, (list, tuple)) else default
        return f"{text} (default: {shown})" if text else f"default: {shown}"


def doc_help(doc: str) -> dict:
    """``argparse.ArgumentParser``'s description, epilog and formatter from a module docstring: its first paragraph,
    the rest (the examples, the details), with reStructuredText's double backquotes shown as single ones."""
    plain = re.sub(r"``([^`]+)``", r"`\1`", doc or "").strip()
    first, _, rest = plain.partition("\n\n")
    return {"description": first, "epilog": rest.strip("\n").rstrip() or None, "formatter_class": HelpFormatter}


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
