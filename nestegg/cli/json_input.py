"""JSON the user gives a command: as an argument or option's text, or in a file (``-``:
stdin). Whatever is not JSON, or cannot be read, is bad usage (exit 2) named by where it
came from. NaN, Infinity and -Infinity, which ``nestegg inspect`` and ``show`` print bare
(JSON has no number for them), are refused saying so, and how to give them instead."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import orjson

from nestegg.cli.app import CommandError
from nestegg.constants import EXIT_USAGE

_NON_FINITE = ("NaN", "Infinity", "-Infinity")

STANDARD_STREAM = "-"
"""The file name that means stdin (a file read) or stdout (a file written)."""


def _non_finite(error: orjson.JSONDecodeError, what: str, advice: str) -> CommandError | None:
    """The refusal of a bare NaN, Infinity or -Infinity where ``error`` was met (None: it
    is not one); ``advice`` says how to give one instead."""
    if not error.doc[error.pos :].startswith(_NON_FINITE):
        return None
    at = f"line {error.lineno} column {error.colno}"
    return CommandError(
        f"{what} is not JSON: NaN, Infinity and -Infinity are not JSON numbers ({at})"
        + (f"; {advice}" if advice else ""),
        EXIT_USAGE,
    )


def parse_json(text: str, what: str, advice: str = "") -> Any:
    """The value of ``text``, given as ``what`` (``"--data"``); ``advice`` says how to
    give a NaN or an infinity, which JSON has no number for.

    Raises:
        CommandError: (bad usage) ``text`` is not JSON.
    """
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError as error:
        raise _non_finite(error, what, advice) or CommandError(
            f"{what} is not JSON ({error}): quote a string as '\"text\"'", EXIT_USAGE
        ) from None


def read_json(source: str, named: str | None = None, advice: str = "") -> Any:
    """The value in the file ``source`` (``-``: stdin), given as the option ``named``
    (None: an argument, named by its path alone); ``advice`` as :func:`parse_json`'s.

    Raises:
        CommandError: (bad usage) the file cannot be read, or is not JSON.
    """
    return read_json_text(source, named, advice)[0]


def read_json_text(source: str, named: str | None = None, advice: str = "") -> tuple[Any, bytes]:
    """As :func:`read_json`: the value, and the text it was read from."""
    where = source if named is None else f"{named} {source}"
    try:
        raw = sys.stdin.buffer.read() if source == STANDARD_STREAM else Path(source).read_bytes()
    except OSError as error:
        raise CommandError(f"cannot read {where}: {error.strerror or error}", EXIT_USAGE) from error
    try:
        return orjson.loads(raw), raw
    except orjson.JSONDecodeError as error:
        refused = _non_finite(error, where, advice)
        raise refused or CommandError(f"{where} is not JSON: {error}", EXIT_USAGE) from error
