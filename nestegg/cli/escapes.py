"""Text a terminal would act on, written out: control and bidi characters as Python
escapes. Every line the command writes goes through :func:`escaped` (its error lines
and log records too, which is why this module imports nothing: the command reports an
error before it has imported how to print a table)."""

from __future__ import annotations

import re

FORMAT_CHARS = "\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069"
"""The invisible format characters that reorder or hide the text around them on a
terminal (the bidi marks, embeddings, overrides and isolates), as a regex class's ranges."""
_UNSAFE_IN_TEXT = re.compile(f"[\x00-\x1f\x7f-\x9f{FORMAT_CHARS}]")
"""What a terminal acts on: C0, DEL, C1 and the format characters."""


def escaped(text: str) -> str:
    """``text`` with its control and bidi characters written as Python escapes (``\\n``,
    ``\\x1b``, ``\\u202e``), so a stored id or name cannot move the cursor, recolour or
    clear the terminal, reorder what it shows, or break a table's lines; every line,
    note and table cell (:func:`~nestegg.cli.render.table_cell`) goes through it
    (``--json`` has the text whole)."""
    if text.isprintable():
        return text
    return _UNSAFE_IN_TEXT.sub(lambda match: repr(match.group())[1:-1], text)


def escaped_lines(text: str) -> str:
    """``text`` :func:`escaped` line by line, its newlines kept (a traceback, a log record)."""
    return "\n".join(escaped(line) for line in text.split("\n"))
