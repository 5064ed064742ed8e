"""Seconds given to an option (``--poll-interval 0.5``, ``--grace 30``): digits 0-9, as
durations are; ``nan``, ``inf``, ``1e3`` and other scripts' digits, which ``float`` takes,
are refused saying what they are not."""

from __future__ import annotations

import re
from collections.abc import Callable

import typer

from nestegg.durations import MAX_SECONDS

_DECIMAL = re.compile(r"-?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)")


def seconds_parser(least: float) -> Callable[[str], float]:
    """A typer ``parser=`` reading seconds from ``least`` to 100 years.

    Example:
        >>> typer.Option(parser=seconds_parser(0.01), metavar="SECONDS")
    """

    def parse(text: str | float) -> float:
        if isinstance(text, float):  # the default, given as it is
            return text
        if not _DECIMAL.fullmatch(text.strip()):
            raise typer.BadParameter(
                f"{text!r} is not a number of seconds: give digits 0-9, such as 30 or 0.5"
            )
        value = float(text)
        if value < least:
            raise typer.BadParameter(f"{text.strip()} is less than {least:g} seconds")
        if value > MAX_SECONDS:
            raise typer.BadParameter(f"{text.strip()} seconds is more than 100 years")
        return value

    return parse


__all__ = ["seconds_parser"]
