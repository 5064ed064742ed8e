"""Data someone gives (``nestegg fork --data``, the inspector's fork editor), read back as
the codec reads what it stores: ``{"$ne": "map", "v": [[1, "a"]]}`` is ``{1: "a"}``.

Every tagged object in it is checked first: one the codec writes, whole (``"$ne"`` and
``"v"``, nothing else) and well formed (valid base64, a date in ISO 8601, a map of pairs
with each key once, a set of items each once, ...), or it is refused naming where it is
(its path from ``data``, as ``nestegg inspect --path`` takes it) and what it should be, in
plain words. A JSON object with a key twice, whose last value the JSON reader keeps, is
refused so too (:func:`refuse_key_twice`, given the text read), as is one in other plain
JSON someone gives (``nestegg signal``'s value, a file ``nestegg import`` reads and each
record in it).
"""

from __future__ import annotations

import json
import re
import zoneinfo
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson

from nestegg.checkpoint.codec import (
    DAMAGED_TAG,
    INT_MAX_DIGITS,
    TAG,
    DuplicateKeys,
    EnumKeyNotRebuilt,
    encode_value,
    from_jsonable,
    rebuild_given,
)
from nestegg.checkpoint.iso_times import zone_named
from nestegg.errors import CheckpointSerializationError, ConfigurationError

_SHOWN_CHARS = 120
"""How much of a given value an error shows."""
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_\-]*$")
_OWN_DICT = f"a dict of your own with a {TAG!r} key is written "
_OWN_DICT += f'{{"{TAG}": "map", "v": [[key, value], ...]}}'

_EXPECTED = {
    "datetime": 'a date and time in ISO 8601 ("2024-01-02T03:04:05+00:00"; in a time zone '
    '"2024-01-02T03:04:05+01:00[Europe/Berlin]")',
    "date": 'a date in ISO 8601 ("2024-01-02")',
    "time": 'a time in ISO 8601 ("03:04:05"; in a time zone "03:04:05[Europe/Berlin]")',
    "timedelta": "[days, seconds, microseconds], three integers",
    "uuid": 'a UUID ("12345678-1234-5678-1234-567812345678")',
    "decimal": 'a decimal number as a string ("1.50", "NaN")',
    "bytes": 'the bytes in base64 ("aGk=": A-Z, a-z, 0-9, + and /, padded with = to a '
    "multiple of 4 characters)",
    "int": 'an integer\'s digits as a string ("18446744073709551616")',
    "float": 'a float as a string ("NaN", "Infinity", "-Infinity")',
    "enum": '["module:Class", value]',
    "tuple": "a list of its items",
    "set": "a list of its items",
    "frozenset": "a list of its items",
    "map": "a list of [key, value] pairs",
}
"""What the ``"v"`` of each tag the codec writes is, for people (in the codec's order)."""
_UNHASHABLE = ("set", "map")
"""Tags whose value is no dict's key."""


def _shown(given: Any) -> str:
    """Given JSON as an error shows it, cut after _SHOWN_CHARS characters."""
    try:
        shown = orjson.dumps(given).decode()
    except orjson.JSONEncodeError:  # an int past 64 bits, given in this process
        shown = repr(given)
    return shown[:_SHOWN_CHARS] + "…" if len(shown) > _SHOWN_CHARS else shown


def _key_path(path: str, key: str) -> str:
    return f"{path}.{key}" if _IDENTIFIER.match(key) else f"{path}[{_shown(key)}]"


class _Refused(Exception):
    """A given value refused at ``path``: ``shown`` is it, ``reason`` what is wrong."""

    def __init__(self, path: str, given: Any, reason: str) -> None:
        super().__init__(reason)
        self.path, self.given, self.reason = path, given, reason


def _is_int(value: Any) -> bool:
    return type(value) is int


def _check(value: Any, path: str) -> None:
    """Refuse (:class:`_Refused`) the first tagged object in ``value`` that the codec
    does not write, outer ones first."""
    if type(value) is list:
        for index, item in enumerate(value):
            _check(item, f"{path}[{index}]")
    elif type(value) is dict:
        if TAG in value:
            _check_tag(value, path)
        else:
            for key, item in value.items():
                _check(item, _key_path(path, key))


def _check_tag(value: dict[str, Any], path: str) -> None:
    tag = value[TAG]
    if not isinstance(tag, str) or tag not in _EXPECTED:
        raise _Refused(path, value, f"unknown tag {_shown(tag)}; one of {', '.join(_EXPECTED)}")
    wanted = f'a {tag!r} tag is {{"{TAG}": "{tag}", "v": {_EXPECTED[tag]}}}'
    if "v" not in value:
        raise _Refused(path, value, f'it has no "v": {wanted}')
    if len(value) != 2:
        others = ", ".join(_shown(key) for key in value if key not in (TAG, "v"))
        raise _Refused(path, value, f"it has other keys ({others}): {wanted}")
    given = value["v"]
    check = _CHECKS.get(tag)
    try:
        fine = check(given, path) if check else isinstance(given, str) and _rebuilds(value)
    except _Refused:
        raise
    except DAMAGED_TAG:
        fine = False
    if not fine:
        raise _Refused(path, value, f"its value is not {_EXPECTED[tag]}")


def _rebuilds(value: Any) -> bool:
    """Whether the tagged scalar ``value`` is rebuilt (raises what the codec's raises)."""
    from_jsonable(value)
    return True


def _check_timedelta(given: Any, path: str) -> bool:
    whole = type(given) is list and len(given) == 3 and all(map(_is_int, given))
    return whole and _rebuilds({TAG: "timedelta", "v": given})


def _check_zoned(tag: str) -> Callable[[Any, str], bool]:
    """The check of a datetime or time, which may name its time zone: one this machine's
    time zone database lacks is refused saying so."""

    def check(given: Any, path: str) -> bool:
        if not isinstance(given, str):
            return False
        try:
            return _rebuilds({TAG: tag, "v": given})
        except zoneinfo.ZoneInfoNotFoundError:
            zone = zone_named(given)[1]
            reason = (
                f"its time zone {_shown(zone)} is not in this machine's time zone database: "
                'name an IANA time zone, as "Europe/Berlin"'
            )
            raise _Refused(path, {TAG: tag, "v": given}, reason) from None

    return check


def _check_enum(given: Any, path: str) -> bool:
    if type(given) is not list or len(given) != 2:
        return False
    where = given[0]
    if not isinstance(where, str) or not all(where.partition(":")[::2]):
        return False
    _check(given[1], f"{path}.value")
    return True


def _check_items(given: Any, path: str) -> bool:
    if type(given) is not list:
        return False
    _check(given, path)
    return True


def _is_pair(entry: Any) -> bool:
    return type(entry) is list and len(entry) == 2


def _check_map(given: Any, path: str) -> bool:
    if type(given) is not list or not all(map(_is_pair, given)):
        return False
    for key, item in given:
        if type(key) is list or (type(key) is dict and key.get(TAG) in (None, *_UNHASHABLE)):
            raise _Refused(f"{path}.<key>", key, "a list, a dict or a set is no dict's key")
        _check(key, f"{path}.<key>")
        _check(item, f"{path}[{_shown(key)}]")
    return True


def _check_int(given: Any, path: str) -> bool:
    """An int's digits; more of them than Python reads back are refused as such."""
    if not isinstance(given, str):
        return False
    digits = given.removeprefix("-")
    if digits.isascii() and digits.isdigit() and len(digits) > INT_MAX_DIGITS:
        reason = f"its value has {len(digits):,} digits, more than Python reads back"
        raise _Refused(path, {TAG: "int", "v": "..."}, f"{reason} ({INT_MAX_DIGITS:,})")
    return _rebuilds({TAG: "int", "v": given})


_CHECKS: dict[str, Callable[[Any, str], bool]] = {
    "datetime": _check_zoned("datetime"),
    "time": _check_zoned("time"),
    "timedelta": _check_timedelta,
    "int": _check_int,
    "enum": _check_enum,
    "tuple": _check_items,
    "set": _check_items,
    "frozenset": _check_items,
    "map": _check_map,
}


def _inner(value: Any, path: str) -> list[tuple[str, Any]]:
    """What ``value`` holds, each with its path (a tag's: its ``"v"`` at the tag's path; a
    map's keys and values, at their paths as :func:`_check_map` names them)."""
    if type(value) is dict:
        held = value.get("v")
        if value.get(TAG) == "map" and type(held) is list and all(_is_pair(e) for e in held):
            return [p for k, v in held for p in ((f"{path}.<key>", k), (f"{path}[{_shown(k)}]", v))]
        if TAG in value:
            return [(path, held)]
    return _plain_inner(value, path)


def _tag_path(value: Any, entries: list[Any], path: str) -> str | None:
    """The path of the tagged object in ``value`` whose ``"v"`` is ``entries`` (that list)."""
    if type(value) is dict and TAG in value and value.get("v") is entries:
        return path
    found = (_tag_path(v, entries, at) for at, v in _inner(value, path))
    return next((p for p in found if p), None)


def _unrebuilt(value: Any, path: str) -> tuple[str, Any] | None:
    """The innermost tagged object in ``value`` that is not rebuilt, with its path."""
    for at, item in _inner(value, path):
        if (found := _unrebuilt(item, at)) is not None:
            return found
    if type(value) is dict and TAG in value:  # what it holds is rebuilt: this tag is not
        try:
            rebuild_given(value)
        except DAMAGED_TAG:
            return path, value
        except (DuplicateKeys, EnumKeyNotRebuilt):  # refused for another reason
            pass
    return None


@dataclass(frozen=True, slots=True)
class GivenData:
    """Data someone gave, rebuilt (``value``), and its JSON as the codec stores it
    (``encoded``), made when it was checked: a fork given it stores that JSON, so the data
    is encoded once, not once to check it and again to store it."""

    value: Any
    encoded: bytes


def from_given(value: Any, what: str) -> Any:
    """JSON someone gave, ``what`` (``"--data"``), rebuilt as the codec rebuilds what it
    stores (:func:`given_data`'s value; None: no data given).

    Raises:
        ConfigurationError: what :func:`given_data` refuses, as it says it.
    """
    given = given_data(value, what)
    return None if given is None else given.value


def given_data(value: Any, what: str) -> GivenData | None:
    """JSON someone gave, ``what`` (``"--data"``), rebuilt as the codec rebuilds what it
    stores, with the JSON it is stored as (None: no data given, JSON's null): a dict of
    one's own with a ``"$ne"`` key is given as the codec writes it, tagged
    (``{"$ne": "map", "v": [["$ne", ...]]}``).

    Raises:
        ConfigurationError: naming ``what`` and the path: a tagged object the codec does not
            write (an unknown tag, one without ``"v"`` or with other keys, a ``"v"`` that is
            not what its tag holds: invalid base64, a date not in ISO 8601, ...); a map with
            one key twice, a set or frozenset with one item twice; or a dict's key holding
            an enum of no module this process imported (a value is then its plain value, a
            key is not: it could be another key of the dict); data the codec cannot store,
            with its message: nested deeper than it writes, or over ``RECORD_MAX_BYTES``
            encoded (``cannot store data: it is 73,400,322 bytes encoded, over ...``).
    """
    rebuilt = _rebuilt(value, what) if type(value) in (dict, list) else value
    if rebuilt is None:
        return None
    try:  # refused now, as bad input, and kept: the fork stores this JSON
        return GivenData(rebuilt, encode_value(rebuilt, "data"))
    except CheckpointSerializationError as error:
        raise ConfigurationError(str(error)) from None


def _rebuilt(value: dict[str, Any] | list[Any], what: str) -> Any:
    """:func:`given_data` of a dict or a list: rebuilt, or ConfigurationError saying why not."""
    try:
        _check(value, "data")
        return rebuild_given(value)
    except RecursionError:  # what Python's stack does not hold, the codec does not write
        detail = "nested too deeply"
        refused = CheckpointSerializationError("data", type(value).__qualname__, detail)
        raise ConfigurationError(str(refused)) from None
    except _Refused as refused:
        raise ConfigurationError(
            f"{what} holds {_shown(refused.given)} at {refused.path}, which is not a value "
            f"the codec writes ({refused.reason}); {_OWN_DICT}"
        ) from None
    except DuplicateKeys as twice:
        where = _tag_path(value, twice.entries, "data") or "data"
        one, has = ("key", "a dict") if twice.tag == "map" else ("item", f"a {twice.tag}")
        same = (
            f"{_shown(twice.first)} and {_shown(twice.second)} are one {one}"
            if twice.first != twice.second or type(twice.first) is not type(twice.second)
            else f"{_shown(twice.first)} is there twice"
        )
        raise ConfigurationError(
            f"{what} holds a {twice.tag} at {where} with one {one} twice ({same}): {has} has "
            f"each {one} once; give each {one} once"
        ) from None
    except EnumKeyNotRebuilt as error:
        raise ConfigurationError(
            f"{what} holds the key {_shown(error.key)}, whose enum {error.where} is of no "
            "module this process has imported (given data imports none); as its plain "
            "value it could be another key: give that value as the key if it is the one "
            "you mean"
        ) from None
    except DAMAGED_TAG as error:  # what the checks let through: an enum's unknown value
        path, found = _unrebuilt(value, "data") or ("data", value)
        raise ConfigurationError(
            f"{what} holds {_shown(found)} at {path}, which is not a value the codec "
            f"writes (it is not rebuilt: {error}); {_OWN_DICT}"
        ) from None


class _KeyTwice(Exception):
    """An object of the JSON read has a key twice."""


class _Twice:
    """An object of the JSON read with ``key`` twice, where it is."""

    def __init__(self, key: str) -> None:
        self.key = key


def _once(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    kept = dict(pairs)
    if len(kept) != len(pairs):
        raise _KeyTwice
    return kept


def _marked(pairs: list[tuple[str, Any]]) -> dict[str, Any] | _Twice:
    kept: dict[str, Any] = {}
    for key, item in pairs:
        if key in kept:
            return _Twice(key)
        kept[key] = item
    return kept


def _plain_inner(value: Any, path: str) -> list[tuple[str, Any]]:
    """What ``value``, plain JSON (no tag read as one), holds, each with its path."""
    if type(value) is dict:
        return [(_key_path(path, k), v) for k, v in value.items()]
    if type(value) is list:
        return [(f"{path}[{i}]", v) for i, v in enumerate(value)]
    return []


def _key_twice(
    value: Any, path: str, inner: Callable[[Any, str], list[tuple[str, Any]]]
) -> tuple[str, str] | None:
    """The path of the first object in ``value`` (read with :func:`_marked`) with a key
    twice, and that key; ``inner`` says what a value holds."""
    if isinstance(value, _Twice):
        return path, value.key
    found = (_key_twice(v, at, inner) for at, v in inner(value, path))
    return next((f for f in found if f), None)


def is_orjson_text(raw: str | bytes) -> bool:
    """Whether ``raw`` is orjson's own text of what it reads: then each object in it has
    each key once (of a key twice, that text would hold one)."""
    try:
        return orjson.dumps(orjson.loads(raw)) == (raw.encode() if isinstance(raw, str) else raw)
    except (ValueError, TypeError):  # not JSON orjson reads (or writes): the full check says
        return False


def refuse_key_twice(
    raw: str | bytes, what: str, field: str | None = None, plain: bool = False
) -> None:
    """Refuse the JSON text someone gave, ``what`` (``"--data"``), if an object in it has a
    key twice: orjson, which read it, keeps the last value and says nothing. With
    ``field``, ``raw`` is a request body whose field ``field`` holds the data. ``plain``:
    ``raw`` is plain JSON (a signal's value, an export, a record of one), not data in the
    codec's tagged form, and paths are named from its top (``steps[3]``, ``the top
    level``), not from ``data``.

    Raises:
        ConfigurationError: naming ``what``, the path of the object and the key.
    """
    try:  # the stdlib's reader, which hands each object's pairs over: fast when all is well
        json.loads(raw, object_pairs_hook=_once)
        return
    except _KeyTwice:
        marked = json.loads(raw, object_pairs_hook=_marked)
    except (ValueError, RecursionError):  # text this reader does not take: the caller judged it
        return
    if field is not None:
        if isinstance(marked, _Twice):
            raise ConfigurationError(
                f"the request body has the field {_shown(marked.key)} twice: give it once"
            )
        marked = marked.get(field) if type(marked) is dict else None
    found = _key_twice(marked, "", _plain_inner) if plain else _key_twice(marked, "data", _inner)
    if found is not None:
        path, key = found
        raise ConfigurationError(
            f"{what} holds a dict at {path.removeprefix('.') or 'the top level'} with one key "
            f"twice ({_shown(key)} is there twice): a dict has each key once; give each key once"
        )
