"""Paths into a state: ``data.items[3].name`` (``data.items.3.name`` works too)."""

from __future__ import annotations

import re
from typing import Any

_TOKEN = re.compile(r"\[(-?\d+)\]|\[(['\"])(.*?)\2\]|([^.\[\]]+)")
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_\-]*$")

Key = str | int


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
        if match is None:
            raise ValueError(f"malformed path {path!r} at character {position + 1}")
        index, _, quoted, name = match.groups()
        keys.append(int(index) if index is not None else quoted if quoted is not None else name)
        position = match.end()
    if not keys:
        raise ValueError("empty path")
    return keys


def format_path(keys: list[Key]) -> str:
    """The path text for ``keys`` (the inverse of :func:`parse_path`)."""
    parts: list[str] = []
    for key in keys:
        if isinstance(key, int):
            parts.append(f"[{key}]")
        elif _IDENTIFIER.match(key):
            parts.append(f".{key}" if parts else key)
        else:
            parts.append(f"[{key!r}]")
    return "".join(parts)


def _step(value: Any, key: Key) -> Any:
    if isinstance(value, dict):
        if key in value:
            return value[key]
        if isinstance(key, int) and str(key) in value:
            return value[str(key)]
        raise KeyError(key)
    if isinstance(value, list | tuple):
        index = int(key) if isinstance(key, int) or key.lstrip("-").isdigit() else None
        if index is None:
            raise KeyError(key)
        return value[index]
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
        except (KeyError, IndexError):
            found = format_path(keys[:depth]) or "the state"
            raise PathNotFoundError(
                f"no {format_path(keys[: depth + 1])!r} in the state ({found} has "
                f"{_describe(current)})"
            ) from None
    return current


def _describe(value: Any) -> str:
    if isinstance(value, dict):
        names = ", ".join(str(k) for k in list(value)[:10])
        return f"keys {names}" if names else "no keys"
    if isinstance(value, list | tuple):
        return f"{len(value)} items"
    return f"a {type(value).__name__}"
