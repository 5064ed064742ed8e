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


def source_name(source: str, named: str | None = None) -> str:
    """How errors name the file ``source`` given as the option ``named`` (None: an
    argument, named by its path alone): ``-`` is standard input."""
    where = "standard input" if source == STANDARD_STREAM else source
    return where if named is None else f"{named} {where}"


def refuse_empty_path(path: str, named: str | None, stream: str) -> None:
    """Refuse an empty ``path`` given as the option ``named`` (None: an argument), which
    ``Path`` would take for the current directory; ``stream``: what ``-`` stands for.

    Raises:
        CommandError: (bad usage) ``the path given to --output is empty: ...``.
    """
    if not path:
        given = f"given to {named}" if named is not None else "given"
        raise CommandError(
            f"the path {given} is empty: give a file's path, or - for {stream}", EXIT_USAGE
        )


def read_json(source: str, named: str | None = None, advice: str = "") -> Any:
    """The value in the file ``source`` (``-``: stdin), given as the option ``named``
    (None: an argument, named by its path alone); ``advice`` as :func:`parse_json`'s.

    Raises:
        CommandError: (bad usage) the path is empty, the file cannot be read, or is empty
            or not JSON.
    """
    return read_json_text(source, named, advice)[0]


def read_json_text(source: str, named: str | None = None, advice: str = "") -> tuple[Any, bytes]:
    """As :func:`read_json`: the value, and the text it was read from."""
    refuse_empty_path(source, named, "standard input")
    where = source_name(source, named)
    try:
        raw = sys.stdin.buffer.read() if source == STANDARD_STREAM else Path(source).read_bytes()
    except OSError as error:
        raise CommandError(f"cannot read {where}: {error.strerror or error}", EXIT_USAGE) from error
    if not raw.strip():
        raise CommandError(f"{where} is empty: it holds no JSON", EXIT_USAGE)
    try:
        return orjson.loads(raw), raw
    except orjson.JSONDecodeError as error:
        refused = _non_finite(error, where, advice)
        raise refused or CommandError(f"{where} is not JSON: {error}", EXIT_USAGE) from error
