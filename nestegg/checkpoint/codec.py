"""Encoding of stored values: exact JSON round trips, checksummed records, no pickle.

Values become JSON with orjson. Types JSON has no word for (datetime, date, time, UUID,
Decimal, bytes, Enum, tuple, set, non-string keys, big ints, NaN) are written as a tagged
object ``{"$ne": tag, "v": ...}`` and rebuilt on reading, so what ``model_dump()`` produces
comes back equal. Anything else fails with :class:`CheckpointSerializationError` naming the
value's path and type.

Every stored record is *sealed*: ``{"crc":"<8 hex>","body":<json>}``, still readable JSON,
whose checksum (CRC-32 of the body bytes) is checked on every read.
"""

from __future__ import annotations

import base64
import contextlib
import contextvars
import datetime as dt
import importlib
import math
import sys
import uuid
import zlib
from collections.abc import Sequence
from decimal import Decimal
from enum import Enum
from operator import eq, itemgetter, methodcaller
from typing import Any

import orjson
from pydantic import BaseModel

from nestegg.constants import RECORD_MAX_BYTES
from nestegg.errors import (
    CheckpointCorruptedError,
    CheckpointSerializationError,
    ConfigurationError,
    RecordTooLargeError,
)
from nestegg.module_names import stable_module_name, started_module

TAG = "$ne"
_INT_LIMIT = 2**63
INT_MAX_DIGITS = sys.int_info.default_max_str_digits
"""The most decimal digits of an int that is stored: what Python converts to and from text
unless ``sys.set_int_max_str_digits`` allows more, so every reader reads it back."""
_INT_MAX_BITS = math.ceil(INT_MAX_DIGITS / math.log10(2)) + 1
"""Any int of more bits has more than INT_MAX_DIGITS digits."""
_SEAL_HEAD = b'{"crc":"'
_SEAL_MID = b'","body":'
_BODY_AT = len(_SEAL_HEAD) + 8 + len(_SEAL_MID)


def _tag(tag: str, value: Any) -> dict[str, Any]:
    return {TAG: tag, "v": value}


def _encode_scalar(value: Any, path: str) -> Any:
    if isinstance(value, Enum):
        module = stable_module_name(type(value).__module__)
        where = f"{module}:{type(value).__qualname__}"
        return _tag("enum", [where, to_jsonable(value.value, f"{path}.value")])
    if isinstance(value, dt.datetime):
        return _tag("datetime", value.isoformat())
    if isinstance(value, dt.date):
        return _tag("date", value.isoformat())
    if isinstance(value, dt.time):
        return _tag("time", value.isoformat())
    if isinstance(value, dt.timedelta):
        return _tag("timedelta", [value.days, value.seconds, value.microseconds])
    if isinstance(value, uuid.UUID):
        return _tag("uuid", str(value))
    if isinstance(value, Decimal):
        return _tag("decimal", str(value))
    if isinstance(value, bytes | bytearray):
        return _tag("bytes", base64.b64encode(value).decode("ascii"))
    if isinstance(value, BaseModel):
        return to_jsonable(value.model_dump(), path)
    raise CheckpointSerializationError(path, type(value).__qualname__)


def _big_int(value: int, path: str) -> dict[str, Any]:
    """An int past 64 bits, tagged with its decimal digits; one of more than INT_MAX_DIGITS
    digits (or more than this process writes out) is refused, told by its bits before it
    is written out (a huge one would take long)."""
    text = ""
    if value.bit_length() <= _INT_MAX_BITS:
        with contextlib.suppress(ValueError):  # more digits than this process writes out
            text = str(value)
    if not text or len(text) - (value < 0) > INT_MAX_DIGITS:
        digits = min(filter(None, (INT_MAX_DIGITS, sys.get_int_max_str_digits())))
        detail = f"it has more than {digits:,} digits, more than Python reads back"
        raise CheckpointSerializationError(path, "int", detail)
    return _tag("int", text)


_AS_IS = frozenset({str, bool, type(None)})


def to_jsonable(value: Any, path: str = "data") -> Any:
    """``value`` as plain JSON types, tagging the rest; raises naming the first bad path."""
    kind = type(value)
    if kind is str or kind is bool or value is None:
        return value
    if kind is int:
        return value if -_INT_LIMIT <= value < _INT_LIMIT else _big_int(value, path)
    if kind is float:
        return value if math.isfinite(value) else _tag("float", repr(value))
    if kind is dict:
        if all(type(k) is str for k in value) and TAG not in value:
            # Strings, booleans and None are kept as they are, without building their path.
            return {
                k: v if type(v) in _AS_IS else to_jsonable(v, f"{path}.{k}")
                for k, v in value.items()
            }
        return _tag(
            "map",
            [
                [to_jsonable(k, f"{path}.<key>"), to_jsonable(v, f"{path}[{k!r}]")]
                for k, v in value.items()
            ],
        )
    if kind is list:
        return [to_jsonable(v, f"{path}[{i}]") for i, v in enumerate(value)]
    if kind is tuple:
        return _tag("tuple", [to_jsonable(v, f"{path}[{i}]") for i, v in enumerate(value)])
    if kind is set or kind is frozenset:
        items = [to_jsonable(v, f"{path}[{i}]") for i, v in enumerate(value)]
        return _tag("frozenset" if kind is frozenset else "set", items)
    return _encode_scalar(value, path)


_imports_allowed: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "nestegg_codec_imports_allowed", default=True
)
"""False while :func:`from_given` rebuilds what someone gave: an enum's module must be one
this process imported already (what the codec stored is rebuilt as it was written)."""


_in_given_key: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "nestegg_codec_in_given_key", default=False
)
"""True while :func:`from_given` rebuilds a dict's key: an enum there that is not rebuilt
is refused, not made its plain value, which could be another key of the dict."""


class _EnumKeyNotRebuilt(Exception):
    """An enum in a key someone gave whose class this process has not imported."""

    def __init__(self, where: str, key: Any = None) -> None:
        super().__init__(where)
        self.where, self.key = where, key


def _restore_enum(spec: list[Any]) -> Any:
    where, raw = spec
    value = from_jsonable(raw)
    module, _, qualname = str(where).partition(":")
    try:
        target: Any = started_module(module) or (
            importlib.import_module(module) if _imports_allowed.get() else sys.modules[module]
        )
        for part in qualname.split("."):
            target = getattr(target, part)
    except (ImportError, AttributeError, KeyError):
        target = None
    if isinstance(target, type) and issubclass(target, Enum):
        return target(value)
    if _in_given_key.get():
        raise _EnumKeyNotRebuilt(str(where))
    return value


def _restore_map(entries: list[Any]) -> dict[Any, Any]:
    if _imports_allowed.get():
        return {from_jsonable(k): from_jsonable(x) for k, x in entries}
    return {_given_key(k): from_jsonable(x) for k, x in entries}


def _given_key(raw: Any) -> Any:
    """A key of a dict someone gave, rebuilt; an enum in it must be rebuilt too."""
    inside = _in_given_key.set(True)
    try:
        return from_jsonable(raw)
    except _EnumKeyNotRebuilt as error:
        raise _EnumKeyNotRebuilt(error.where, raw) from None
    finally:
        _in_given_key.reset(inside)


_DECODERS: dict[str, Any] = {
    "datetime": dt.datetime.fromisoformat,
    "date": dt.date.fromisoformat,
    "time": dt.time.fromisoformat,
    "timedelta": lambda v: dt.timedelta(days=v[0], seconds=v[1], microseconds=v[2]),
    "uuid": uuid.UUID,
    "decimal": Decimal,
    "bytes": base64.b64decode,
    "int": int,
    "float": float,
    "enum": _restore_enum,
    "tuple": lambda v: tuple(from_jsonable(x) for x in v),
    "set": lambda v: {from_jsonable(x) for x in v},
    "frozenset": lambda v: frozenset(from_jsonable(x) for x in v),
    "map": _restore_map,
}


def from_jsonable(value: Any) -> Any:
    """Rebuild what :func:`to_jsonable` tagged."""
    kind = type(value)
    if kind is dict:
        tag = value.get(TAG)
        if tag is not None and len(value) == 2 and "v" in value:
            return _DECODERS[tag](value["v"])
        return {k: from_jsonable(v) for k, v in value.items()}
    if kind is list:
        return [from_jsonable(v) for v in value]
    return value


_SHOWN_CHARS = 120
"""How much of a tagged object that cannot be rebuilt an error shows."""
_DAMAGED_TAG = (KeyError, TypeError, ValueError, IndexError, ArithmeticError)
"""What rebuilding a tagged object that is not one :func:`to_jsonable` writes raises."""


def _unreadable_tag(value: Any) -> dict[str, Any] | None:
    """The innermost tagged object in ``value`` that :func:`from_jsonable` cannot rebuild."""
    inner = value.values() if type(value) is dict else value if type(value) is list else ()
    for item in inner:
        if (found := _unreadable_tag(item)) is not None:
            return found
    if type(value) is dict and TAG in value:  # what it holds is rebuilt: this tag is not
        try:
            from_jsonable(value)
        except _DAMAGED_TAG:
            return value
    return None


def _shown(given: Any) -> str:
    """Given JSON as an error shows it, cut after _SHOWN_CHARS characters."""
    shown = orjson.dumps(given).decode()
    return shown[:_SHOWN_CHARS] + "…" if len(shown) > _SHOWN_CHARS else shown


def from_given(value: Any, what: str) -> Any:
    """JSON someone gave (the fork editor's, ``--data``) rebuilt as :func:`from_jsonable`
    rebuilds what the codec stored: ``{"$ne": "map", "v": [[1, "a"]]}`` is ``{1: "a"}``,
    and a dict of one's own with a ``"$ne"`` key is given as the codec writes it, tagged.

    Raises:
        ConfigurationError: a tagged object the codec does not write, named, with ``what``;
            or a dict's key holding an enum of no module this process imported (a value
            is then its plain value, a key is not: it could be another key of the dict).
    """
    if type(value) not in (dict, list):
        return value
    allowed = _imports_allowed.set(False)
    try:
        return from_jsonable(value)
    except _EnumKeyNotRebuilt as error:
        raise ConfigurationError(
            f"{what} holds the key {_shown(error.key)}, whose enum {error.where} is of no "
            "module this process has imported (given data imports none); as its plain "
            "value it could be another key: give that value as the key if it is the one "
            "you mean"
        ) from None
    except _DAMAGED_TAG as error:
        found = _unreadable_tag(value)
        tag = found[TAG] if found is not None else None
        reason = (
            f"unknown tag {tag!r}; one of {', '.join(_DECODERS)}"
            if type(error) is KeyError and isinstance(tag, str) and tag not in _DECODERS
            else f"{type(error).__name__}: {error}"
        )
        shown = _shown(found) if found is not None else TAG
        raise ConfigurationError(
            f"{what} holds {shown}, which is not a value the codec writes ({reason}); "
            f"a dict of your own with a {TAG!r} key is written "
            f'{{"{TAG}": "map", "v": [[key, value], ...]}}'
        ) from None
    finally:
        _imports_allowed.reset(allowed)


def has_tags(raw: bytes) -> bool:
    """Whether encoded JSON may hold tagged values (lets plain values skip the rebuild walk)."""
    return b'"$ne"' in raw


def _lone_surrogate_path(tree: Any, path: str) -> str | None:
    """Where in a :func:`to_jsonable` tree the first string UTF-8 cannot hold sits."""
    if type(tree) is str:
        return None if _is_utf8(tree) else path
    if type(tree) is dict:
        if TAG in tree:
            return _lone_surrogate_path(tree["v"], path)
        if not all(_is_utf8(key) for key in tree):
            return f"{path}.<key>"
        items = [(f"{path}.{key}", item) for key, item in tree.items()]
    elif type(tree) is list:
        items = [(f"{path}[{i}]", item) for i, item in enumerate(tree)]
    else:
        return None
    return next((p for p in (_lone_surrogate_path(v, at) for at, v in items) if p), None)


def _is_utf8(text: str) -> bool:
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def encode_value(value: Any, path: str = "data") -> bytes:
    """A user value as JSON bytes (tagged where needed); ``path`` names it (``input``,
    ``data``, ``result of fetch``).

    Raises:
        CheckpointSerializationError: a value that cannot be stored, naming its path and type.
        RecordTooLargeError: its JSON is over RECORD_MAX_BYTES, more than a store takes.
    """
    try:
        tree = to_jsonable(value, path)
    except RecursionError:
        detail = "nested too deeply, or it contains itself"
        raise CheckpointSerializationError(path, type(value).__qualname__, detail) from None
    try:
        encoded = orjson.dumps(tree)
    except orjson.JSONEncodeError as exc:  # a lone surrogate, or nested deeper than orjson goes
        where = _lone_surrogate_path(tree, path)
        type_name = "str" if where else type(value).__qualname__
        raise CheckpointSerializationError(where or path, type_name, str(exc)) from None
    if len(encoded) > RECORD_MAX_BYTES:
        raise RecordTooLargeError(path, type(value).__qualname__, len(encoded), RECORD_MAX_BYTES)
    return encoded


def rebuild(value: Any, where: str) -> Any:
    """:func:`from_jsonable`, with a damaged tag reported as CheckpointCorruptedError."""
    try:
        return from_jsonable(value)
    except _DAMAGED_TAG as exc:
        raise CheckpointCorruptedError(f"{where} holds a damaged value ({exc})") from None


def decode_value(raw: bytes, where: str = "stored value") -> Any:
    """The value :func:`encode_value` wrote; CheckpointCorruptedError naming ``where`` if not."""
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise CheckpointCorruptedError(f"{where} holds invalid JSON") from None
    return rebuild(value, where) if has_tags(raw) else value


def seal(body: bytes) -> bytes:
    """``body`` wrapped with its checksum, as readable JSON."""
    return b"%s%08x%s%s}" % (_SEAL_HEAD, zlib.crc32(body), _SEAL_MID, body)


SEALED_BODY_AT = _BODY_AT
"""Where the body of a sealed record starts (it ends one byte before the record)."""


_SEAL_PREFIX = _SEAL_HEAD + b"%08x" + _SEAL_MID
_prefix_of = itemgetter(slice(0, _BODY_AT))
_body_of = itemgetter(slice(_BODY_AT, -1))
_ends_with_brace = methodcaller("endswith", b"}")


def all_intact(records: Sequence[bytes]) -> bool:
    """Whether every sealed record is whole and unaltered: what :func:`unseal` checks of
    one record (its head, its checksum, its closing brace), for many at once.

    The loop runs in C (``map`` over the records), not one Python step per record: what
    makes checking the ten thousand step records of a long run cheap.
    """
    computed = map(_SEAL_PREFIX.__mod__, map(zlib.crc32, map(_body_of, records)))
    return all(map(eq, computed, map(_prefix_of, records))) and all(map(_ends_with_brace, records))


def unseal(sealed: bytes, where: str) -> bytes:
    """The body of a sealed record; CheckpointCorruptedError naming ``where`` if torn/altered."""
    sealed = bytes(sealed)
    if (
        len(sealed) <= _BODY_AT
        or not sealed.startswith(_SEAL_HEAD)
        or sealed[_BODY_AT - len(_SEAL_MID) : _BODY_AT] != _SEAL_MID
        or not sealed.endswith(b"}")
    ):
        raise CheckpointCorruptedError(f"{where} is torn or not a nestegg record")
    body = sealed[_BODY_AT:-1]
    if sealed[len(_SEAL_HEAD) : len(_SEAL_HEAD) + 8] != b"%08x" % zlib.crc32(body):
        raise CheckpointCorruptedError(f"{where} failed its checksum (torn or altered)")
    return body


def seal_json(value: Any) -> bytes:
    """Plain JSON types, sealed."""
    return seal(orjson.dumps(value))


def unseal_json(sealed: bytes, where: str) -> Any:
    """The plain JSON a sealed record holds; CheckpointCorruptedError if it is damaged."""
    body = unseal(sealed, where)
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError:
        raise CheckpointCorruptedError(f"{where} holds invalid JSON") from None


def unseal_value(sealed: bytes, where: str) -> Any:
    """The user value a sealed record holds; CheckpointCorruptedError if it is damaged."""
    return decode_value(unseal(sealed, where), where)
