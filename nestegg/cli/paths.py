"""Paths into a state: ``data.items[3].name`` (``data.items.3.name`` works too).

A key of a dict is a name (``.name``), an int in brackets (``[1]``), a string in quotes
(``['1']``, or as JSON: ``["it's"]``), or any other key as JSON as the codec stores it
(``[true]``, ``[null]``, ``[1.5]``, ``[NaN]``, ``[{"$ne":"tuple","v":[1,2]}]``), so every
key a stored dict can have has a path of its own. An item of a set is an index in brackets
(``data.tags[0]``), in the order :func:`set_items` gives, the one every display shows.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Hashable
from typing import Any

import orjson

from nestegg.checkpoint.codec import from_jsonable, sets_in_order, to_jsonable
from nestegg.errors import CheckpointSerializationError

_TOKEN = re.compile(r"\[(-?\d+)\]|\['(.*?)'\]|([^.\[\]]+)")
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_\-]*$")
_JSON = json.JSONDecoder()
"""Reads a key written as JSON; NaN, Infinity and -Infinity too, as they are shown."""

Key = Hashable


class PathNotFoundError(LookupError):
    """A path that does not lead to a value; the message names the missing part."""


def parse_path(path: str) -> list[Key]:
    """The keys and indexes of ``path``.

    Raises:
        ValueError: an empty or malformed path.
    """
    keys: list[Key] = []
    position = 0
    text = path.strip()
    while position < len(text):
        if text[position] == "." and keys:
            position += 1
        match = _TOKEN.match(text, position)
        if match is not None:
            index, quoted, name = match.groups()
            keys.append(int(index) if index is not None else quoted if quoted is not None else name)
            position = match.end()
        elif text.startswith("[", position):
            key, position = _json_key(path, text, position)
            keys.append(key)
        else:
            raise ValueError(f"malformed path {path!r} at character {position + 1}")
    if not keys:
        raise ValueError("empty path")
    return keys


def _json_key(path: str, text: str, start: int) -> tuple[Key, int]:
    """The key written as JSON in brackets at ``text[start]`` and where the path goes on.

    Raises:
        ValueError: no JSON there, no closing bracket, or JSON no key can be (a list, an
            object the codec did not write).
    """
    try:
        raw, end = _JSON.raw_decode(text, start + 1)
        key = from_jsonable(raw)
        hash(key)
    except (ValueError, KeyError, TypeError, ArithmeticError):
        end = -1
    if end < 0 or text[end : end + 1] != "]":
        raise ValueError(f"malformed path {path!r} at character {start + 1}")
    return key, end + 1


def _bracketed(key: Key) -> str:
    """A key in brackets: an int as ``[1]``, a string as ``['1']`` (as JSON, ``["it's"]``,
    when it holds a quote or a character that is not printable), any other key as JSON
    as the codec stores it: ``[true]``, ``[null]``, ``[1.5]``, ``[NaN]``,
    ``[{"$ne":"tuple","v":[1,2]}]``, a frozenset's items as :func:`set_items` orders
    them, the same in every process."""
    if type(key) is int:
        return f"[{key}]"
    if isinstance(key, str):
        return f"['{key}']" if "'" not in key and key.isprintable() else f"[{json.dumps(key)}]"
    if isinstance(key, float) and not math.isfinite(key):
        return f"[{json.dumps(key)}]"
    return f"[{encoded(key)}]"


def format_path(keys: list[Key]) -> str:
    """The path text for ``keys`` (the inverse of :func:`parse_path`)."""
    parts: list[str] = []
    for key in keys:
        if isinstance(key, str) and _IDENTIFIER.match(key):
            parts.append(f".{key}" if parts else key)
        else:
            parts.append(_bracketed(key))
    return "".join(parts)


def encoded(value: Any) -> str:
    """``value`` as JSON as the codec stores it, one text for equal values in any process
    (the items of a set sorted): what tells two keys apart (two NaNs are one key here)
    and orders a set's items; :func:`repr` for a value the codec does not store."""
    try:
        return orjson.dumps(sets_in_order(to_jsonable(value))).decode()
    except (CheckpointSerializationError, orjson.JSONEncodeError, RecursionError):
        return repr(value)


def set_items(value: set[Any] | frozenset[Any]) -> list[Any]:
    """The items of a set in the order every display shows them and paths index them:
    sorted by :func:`encoded`, the same in every process (a set's own order of strings
    changes from one process to the next)."""
    return sorted(value, key=encoded)


def _step(value: Any, key: Key) -> Any:
    if isinstance(value, dict):
        if isinstance(key, float) and math.isnan(key):  # NaN equals no NaN: find one
            return next(v for k, v in value.items() if isinstance(k, float) and math.isnan(k))
        if key in value:
            return value[key]
        if type(key) is int and str(key) in value:
            return value[str(key)]
        raise KeyError(key)
    if isinstance(value, set | frozenset):
        value = set_items(value)
    if isinstance(value, list | tuple):
        if type(key) is int:
            return value[key]
        if isinstance(key, str) and key.lstrip("-").isdigit():
            return value[int(key)]
    raise KeyError(key)


def select(value: Any, path: str) -> Any:
    """The part of ``value`` at ``path``.

    Raises:
        ValueError: a malformed path.
        PathNotFoundError: nothing there; names the first key that is missing.
    """
    keys = parse_path(path)
    current = value
    for depth, key in enumerate(keys):
        try:
            current = _step(current, key)
        except (KeyError, IndexError, StopIteration):
            found = format_path(keys[:depth]) or "the state"
            raise PathNotFoundError(
                f"no {format_path(keys[: depth + 1])!r} in the state ({found} has "
                f"{_describe(current)})"
            ) from None
    return current


_KEYS_NAMED = 10
"""The keys of a dict a missing path's error names at most."""


def _describe(value: Any) -> str:
    if isinstance(value, dict):
        shown = str if all(isinstance(k, str) for k in value) else _bracketed
        names = ", ".join(shown(k) for k in list(value)[:_KEYS_NAMED])
        more = len(value) - _KEYS_NAMED
        return (f"keys {names}" + (f" and {more} more" if more > 0 else "")) if names else "no keys"
    if isinstance(value, list | tuple | set | frozenset):
        return f"{len(value)} items"
    return f"a {type(value).__name__}"
