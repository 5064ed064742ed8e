"""Durations given by a caller: seconds or a ``timedelta``, checked in one place."""

from __future__ import annotations

from datetime import timedelta

from nestegg.errors import ConfigurationError


def seconds(value: timedelta | float, what: str) -> float:
    """``value`` in seconds.

    Raises:
        ConfigurationError: not a timedelta or a number of seconds >= 0 (``what`` names it).
    """
    counted = value.total_seconds() if isinstance(value, timedelta) else value
    if isinstance(counted, bool) or not isinstance(counted, int | float) or counted < 0:
        raise ConfigurationError(f"{what} must be a timedelta or seconds >= 0, got {value!r}")
    return float(counted)


def seconds_or_none(value: timedelta | float | None, what: str) -> float | None:
    """:func:`seconds`, or None (no limit) for None."""
    return None if value is None else seconds(value, what)


__all__ = ["seconds", "seconds_or_none"]
