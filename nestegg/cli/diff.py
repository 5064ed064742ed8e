"""What changed between two states: added, removed and changed paths."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from nestegg.checkpoint.codec import KeptEnum, same_stored, to_jsonable
from nestegg.cli.paths import Key, encoded, format_path
from nestegg.cli.render import to_json
from nestegg.constants import CLI_VALUE_ITEMS

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
        """The change as plain data (``value`` when added or removed, ``old`` and ``new``
        when changed, and ``old_type`` and ``new_type`` when those two read the same as
        ``--json`` writes them: see :func:`types_told`)."""
        if self.kind == ADDED:
            return {"path": self.path, "value": self.new}
        if self.kind == REMOVED:
            return {"path": self.path, "value": self.old}
        change = {"path": self.path, "old": self.old, "new": self.new}
        was, now = (to_json(v, indent=False, strict=True) for v in (self.old, self.new))
        if types := types_told(self.old, self.new, was, now):
            change |= {"old_type": types[0], "new_type": types[1]}
        return change


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
    """Of one type and stored alike (:func:`~nestegg.checkpoint.codec.same_stored`): two
    NaNs are the same value here (NaN != NaN in Python, and a Decimal sNaN cannot be
    compared), a set's items in another order too."""
    if type(old) is not type(new):
        return False
    if type(old) in _PLAIN:
        return bool(old == new)
    return same_stored(to_jsonable(old), to_jsonable(new))


_PLAIN = (str, int, bool, type(None))


def types_told(old: Any, new: Any, old_text: str, new_text: str) -> tuple[str, str] | None:
    """What a changed value's types were before and after (``("Color", "int")``), when
    ``old_text`` and ``new_text``, how the two are shown, read the same, so that the change
    shows: a datetime that became its ISO string, an Enum its value, a tuple a list, a tuple
    of datetimes one of strings (``"tuple of datetime"``). None when the texts tell them
    apart, or the types do not (a long string cut the same way in both).

    Example:
        >>> import datetime as dt
        >>> types_told(dt.date(2024, 1, 2), "2024-01-02", '"2024-01-02"', '"2024-01-02"')
        ('date', 'str')
    """
    if old_text != new_text:
        return None
    # the types' names; else the types inside too; else where each is inside
    # (``tuple[tuple[int], list[int]]``); else so (two classes of one name) with their
    # modules' names
    for describe, qualified in _TOLD_BY:
        told = describe(old, qualified), describe(new, qualified)
        if told[0] != told[1]:
            return told
    return None


_CONTAINERS = (list, tuple, set, frozenset, dict)


def _type_name(value: Any, qualified: bool) -> str:
    """``value``'s type's name; an enum whose class this process does not import
    (:class:`KeptEnum`) names its class as stored."""
    if isinstance(value, KeptEnum):
        module, _, name = value.where.partition(":")
        return f"{module}.{name}" if qualified else name
    kind = type(value)
    return f"{kind.__module__}.{kind.__qualname__}" if qualified else kind.__qualname__


def _held_text(value: Any, qualified: bool) -> str:
    """``value``'s type and, for a container, the types it holds, at any depth."""
    name = _type_name(value, qualified)
    inside = sorted({_type_name(v, qualified) for v in _held(value)})
    return f"{name} of {', '.join(inside)}" if inside else name


def _shape_text(value: Any, qualified: bool) -> str:
    """``value``'s type and, for a container, the type of each item where it is
    (``tuple[tuple[int], list[int]]``, ``dict[str: date]``; a set's in one order), the
    first CLI_VALUE_ITEMS items of each."""
    name = _type_name(value, qualified)
    if isinstance(value, dict):
        inside = [
            f"{_shape_text(k, qualified)}: {_shape_text(v, qualified)}" for k, v in value.items()
        ]
    elif isinstance(value, list | tuple):
        inside = [_shape_text(v, qualified) for v in value]
    elif isinstance(value, set | frozenset):
        inside = sorted(_shape_text(v, qualified) for v in value)
    else:
        return name
    more = ", …" if len(inside) > CLI_VALUE_ITEMS else ""  # as diff cuts a long value
    return f"{name}[{', '.join(inside[:CLI_VALUE_ITEMS])}{more}]"


_TOLD_BY = (
    (_type_name, False),
    (_held_text, False),
    (_shape_text, False),
    (_held_text, True),
    (_shape_text, True),
)
"""How :func:`types_told` tells two types apart, the first that does."""


def _held(value: Any) -> list[Any]:
    """Every value inside a container (a dict's keys too), at any depth."""
    if isinstance(value, dict):
        inside = [*value, *value.values()]
    elif isinstance(value, _CONTAINERS):
        inside = list(value)
    else:
        return []
    return [deeper for v in inside for deeper in (v, *_held(v))]


def summarize(changes: list[Change]) -> dict[str, list[dict[str, Any]]]:
    """The changes grouped by kind, as plain data."""
    return {
        kind: [c.to_json() for c in changes if c.kind == kind] for kind in (ADDED, REMOVED, CHANGED)
    }
