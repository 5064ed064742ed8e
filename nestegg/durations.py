"""Durations given by a caller: seconds or a ``timedelta``, checked in one place."""

from __future__ import annotations

from datetime import timedelta

from nestegg.errors import ConfigurationError

MAX_SECONDS = 100 * 365.25 * 86400
"""The longest duration taken (100 years): a wait's end, stored as a time, must stay a
time every store and every listing can show (None is the way to say no limit)."""


def seconds(value: timedelta | float, what: str) -> float:
    """``value`` in seconds.

    Raises:
        ConfigurationError: not a timedelta or a number of seconds from 0 to 100 years (NaN
            and infinity are not), ``what`` naming it.
    """
    counted = value.total_seconds() if isinstance(value, timedelta) else value
    if (
        isinstance(counted, bool)
        or not isinstance(counted, int | float)
        or not 0 <= counted <= MAX_SECONDS  # False for NaN
    ):
        raise ConfigurationError(
            f"{what} must be a timedelta or a number of seconds from 0 to 100 years, "
            f"got {_shown(value)}"
        )
    return float(counted)


def _shown(value: object) -> str:
    """``value`` as a refusal names it: a timedelta in seconds (``-5 s``, where its repr,
    ``datetime.timedelta(days=-1, seconds=86395)``, hides the sign); else its repr."""
    if isinstance(value, timedelta):
        return f"{value.total_seconds():g} s"
    return repr(value)


def seconds_or_none(value: timedelta | float | None, what: str) -> float | None:
    """:func:`seconds`, or None (no limit) for None."""
    return None if value is None else seconds(value, what)


__all__ = ["MAX_SECONDS", "seconds", "seconds_or_none"]
