"""What changed between two states: added, removed and changed paths."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from nestegg.cli.paths import Key, encoded, format_path

ADDED = "added"
REMOVED = "removed"
CHANGED = "changed"


@dataclass(frozen=True, slots=True)
class Change:
    """One difference: its kind, where, and the values before and after."""

    kind: str
    path: str
    old: Any = None
    new: Any = None

    def to_json(self) -> dict[str, Any]:
        """The change as plain data (``old`` for removed, ``new`` for added, both when
        changed)."""
        if self.kind == ADDED:
            return {"path": self.path, "value": self.new}
        if self.kind == REMOVED:
            return {"path": self.path, "value": self.old}
        return {"path": self.path, "old": self.old, "new": self.new}


def diff_values(old: Any, new: Any) -> list[Change]:
    """Every path where ``new`` differs from ``old``, in document order.

    Dicts are compared key by key (keys told apart by their stored JSON: two NaN keys
    are the same key) and lists index by index; anything else (a set, or a change of
    type) is one changed path.

    Example:
        >>> [(c.kind, c.path) for c in diff_values({"a": 1, "b": [1]}, {"a": 2, "b": [1, 2]})]
        [('changed', 'a'), ('added', 'b[1]')]
    """
    changes: list[Change] = []
    _walk(old, new, [], changes)
    return changes


def _walk(old: Any, new: Any, keys: list[Key], changes: list[Change]) -> None:
    if isinstance(old, dict) and isinstance(new, dict):
        later = {_identity(key): key for key in new}
        for key in old:
            match = later.get(_identity(key), _NONE)
            if match is _NONE:
                changes.append(Change(REMOVED, format_path([*keys, key]), old=old[key]))
            else:
                _walk(old[key], new[match], [*keys, key], changes)
        earlier = {_identity(key) for key in old}
        for key in new:
            if _identity(key) not in earlier:
                changes.append(Change(ADDED, format_path([*keys, key]), new=new[key]))
        return
    if isinstance(old, list) and isinstance(new, list):
        for index in range(max(len(old), len(new))):
            path = [*keys, index]
            if index >= len(new):
                changes.append(Change(REMOVED, format_path(path), old=old[index]))
            elif index >= len(old):
                changes.append(Change(ADDED, format_path(path), new=new[index]))
            else:
                _walk(old[index], new[index], path, changes)
        return
    if not _same(old, new):
        changes.append(Change(CHANGED, format_path(keys) or "(state)", old=old, new=new))


_NONE = object()


def _identity(key: Key) -> Key:
    """What tells two keys apart: a string or an int itself, any other key its JSON as
    the codec stores it, so two NaNs are one key (NaN != NaN in Python) and ``True`` is
    not the key ``1``."""
    return key if type(key) is str or type(key) is int else (encoded(key),)


def _same(old: Any, new: Any) -> bool:
    """Equal and of one type; two NaNs are the same value here (NaN != NaN in Python)."""
    if type(old) is not type(new):
        return False
    return bool(old == new) or (isinstance(old, float) and math.isnan(old) and math.isnan(new))


def summarize(changes: list[Change]) -> dict[str, list[dict[str, Any]]]:
    """The changes grouped by kind, as plain data."""
    return {
        kind: [c.to_json() for c in changes if c.kind == kind] for kind in (ADDED, REMOVED, CHANGED)
    }
