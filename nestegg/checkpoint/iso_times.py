"""Datetimes and times as ISO 8601 text that keeps an IANA time zone: the codec's form of
them (see :mod:`nestegg.checkpoint.codec`), which ``nestegg inspect`` shows too."""

from __future__ import annotations

import datetime as dt
import zoneinfo


def iso_text(value: dt.datetime | dt.date | dt.time) -> str:
    """``value`` in ISO 8601; a datetime or time whose time zone is an IANA zone
    (``zoneinfo.ZoneInfo`` with a key) with the zone's name after it in brackets, as RFC
    9557 writes it (``2026-10-25T02:30:00+01:00[Europe/Berlin]``): its offset alone would
    read back as a fixed offset, which names no zone, knows no daylight saving time and
    changes what adding a day gives. Any other time zone is kept as its UTC offset."""
    text = value.isoformat()
    zone = getattr(value, "tzinfo", None)
    if isinstance(zone, zoneinfo.ZoneInfo) and zone.key:  # no key: read from a file
        return f"{text}[{zone.key}]"
    return text


def _zoned(text: str) -> tuple[str, zoneinfo.ZoneInfo | None]:
    """``text`` as :func:`iso_text` writes it: its ISO 8601 part and its zone, if named.

    Raises:
        ValueError: a zone name that is not one (``zoneinfo``'s error).
        KeyError: a zone this machine's time zone database lacks
            (``zoneinfo.ZoneInfoNotFoundError``).
    """
    iso, key = zone_named(text)
    return iso, None if key is None else zoneinfo.ZoneInfo(key)


def zone_named(text: str) -> tuple[str, str | None]:
    """``text`` as :func:`iso_text` writes it: its ISO 8601 part and the name of its zone
    (None: none named).

    Raises:
        ValueError: a ``]`` without its ``[``.
    """
    if not text.endswith("]"):
        return text, None
    iso, bracket, key = text[:-1].rpartition("[")
    if not bracket:
        raise ValueError(f"{text!r} has a ']' without its '['")
    return iso, key


def datetime_from(text: str) -> dt.datetime:
    """A datetime :func:`iso_text` wrote: in its zone, if one is named, with the fold
    whose offset is the one written (the second 02:30 of a night the clocks go back)."""
    iso, zone = _zoned(text)
    value = dt.datetime.fromisoformat(iso)
    if zone is None:
        return value
    if value.tzinfo is None:
        raise ValueError(f"{text!r} names a zone but gives no UTC offset")
    for fold in (0, 1):
        local = value.replace(tzinfo=zone, fold=fold)
        if local.utcoffset() == value.utcoffset():
            return local
    return value.astimezone(zone)  # the zone's rules changed since: the same instant


def time_from(text: str) -> dt.time:
    """A time :func:`iso_text` wrote: in its zone, if one is named."""
    iso, zone = _zoned(text)
    value = dt.time.fromisoformat(iso)
    return value if zone is None else value.replace(tzinfo=zone)


__all__ = ["datetime_from", "iso_text", "time_from", "zone_named"]
