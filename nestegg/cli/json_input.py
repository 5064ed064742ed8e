"""JSON the user gives a command: as an argument or option's text, or in a file (``-``:
stdin). Whatever is not JSON, or cannot be read, is bad usage (exit 2) named by where it
came from."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import orjson

from nestegg.cli.app import CommandError
from nestegg.constants import EXIT_USAGE


def parse_json(text: str, what: str) -> Any:
    """The value of ``text``, given as ``what`` (``"--data"``).

    Raises:
        CommandError: (bad usage) ``text`` is not JSON.
    """
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError as error:
        raise CommandError(
            f"{what} is not JSON ({error}): quote a string as '\"text\"'", EXIT_USAGE
        ) from None


def read_json(source: str, named: str | None = None) -> Any:
    """The value in the file ``source`` (``-``: stdin), given as the option ``named``
    (None: an argument, named by its path alone).

    Raises:
        CommandError: (bad usage) the file cannot be read, or is not JSON.
    """
    where = source if named is None else f"{named} {source}"
    try:
        raw = sys.stdin.buffer.read() if source == "-" else Path(source).read_bytes()
    except OSError as error:
        raise CommandError(f"cannot read {where}: {error.strerror or error}", EXIT_USAGE) from error
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as error:
        raise CommandError(f"{where} is not JSON: {error}", EXIT_USAGE) from error
