"""The help of the jsonargparse commands (``fit``, ``validate``, ``test``, ``predict``, ``prepare``, ``sweep``) as plain
text: jsonargparse takes each option's sentence from a docstring (ours, Lightning's), written in reStructuredText for
the API reference; the terminal gets it through ``utils.argtypes.plain``, as the argparse commands' help does."""
from __future__ import annotations

from jsonargparse import DefaultHelpFormatter

from .argtypes import plain


class PlainHelpFormatter(DefaultHelpFormatter):
    """jsonargparse's help (each option's type and default after its sentence) without reStructuredText."""

    def _expand_help(self, action) -> str:
        return plain(super()._expand_help(action))

    def _format_text(self, text: str) -> str:
        return super()._format_text(plain(text))

    def start_section(self, heading) -> None:
        super().start_section(plain(heading))
