"""Encoding of stored values: exact JSON round trips, checksummed records, no pickle.

Values become JSON with orjson. Types JSON has no word for (datetime, date, time, UUID,
Decimal, bytes, Enum, tuple, set, non-string keys, big ints, NaN) are written as a tagged
object ``{"$ne": tag, "v": ...}`` and rebuilt on reading, so what ``model_dump()`` produces
comes back equal. A datetime or time in an IANA time zone (``zoneinfo.ZoneInfo``) keeps its
zone: its ISO 8601 text is followed by the zone's name in brackets, as RFC 9557 writes it
(:func:`~nestegg.checkpoint.iso_times.iso_text`), and it reads back in that zone, with the
fold its offset tells. Anything else fails with :class:`CheckpointSerializationError`
naming the value's path and type.

Every stored record is *sealed*: ``{"crc":"<8 hex>","body":<json>}``, still readable JSON,
whose checksum (CRC-32 of the body bytes) is checked on every read.
"""

from __future__ import annotations

import base64
import contextlib
import contextvars
import dataclasses
import datetime as dt
import functools
import math
import sys
import uuid
import zlib
from collections.abc import Iterator, Sequence
from decimal import Decimal
from enum import Enum
from operator import eq, itemgetter, methodcaller
from typing import Any

import orjson

from nestegg.checkpoint.iso_times import datetime_from, iso_text, time_from
from nestegg.constants import RECORD_MAX_BYTES
from nestegg.errors import (
    CheckpointCorruptedError,
    CheckpointSerializationError,
    RecordTooLargeError,
)
from nestegg.module_names import named_object, stable_module_name

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


@dataclasses.dataclass(frozen=True, slots=True)
class KeptEnum:
    """An enum member read back under :func:`enums_kept` without its class: ``where`` is
    its class (``module:Qualname``), ``value`` its value's JSON as the codec wrote it; it is
    written back as it was read, its class never imported."""

    where: str
    value: str

    def rebuilt_value(self) -> Any:
        """Its value as :func:`from_jsonable` reads it back."""
        return from_jsonable(orjson.loads(self.value))


def _encode_scalar(value: Any, path: str) -> Any:
    if isinstance(value, KeptEnum):
        return _tag("enum", [value.where, orjson.loads(value.value)])
    if isinstance(value, Enum):
        module = stable_module_name(type(value).__module__)
        where = f"{module}:{type(value).__qualname__}"
        return _tag("enum", [where, to_jsonable(value.value, f"{path}.value")])
    if isinstance(value, dt.datetime):
        return _tag("datetime", iso_text(value))
    if isinstance(value, dt.date):
        return _tag("date", value.isoformat())
    if isinstance(value, dt.time):
        return _tag("time", iso_text(value))
    if isinstance(value, dt.timedelta):
        return _tag("timedelta", [value.days, value.seconds, value.microseconds])
    if isinstance(value, uuid.UUID):
        return _tag("uuid", str(value))
    if isinstance(value, Decimal):
        return _tag("decimal", str(value))
    if isinstance(value, bytes | bytearray):
        return _tag("bytes", base64.b64encode(value).decode("ascii"))
    pydantic = sys.modules.get("pydantic")  # no value is a model before pydantic is imported
    if pydantic is not None and isinstance(value, pydantic.BaseModel):
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
"""False while :func:`rebuild_given` rebuilds what someone gave: an enum's module must be one
this process imported already (what the codec stored is rebuilt as it was written)."""


_in_given_key: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "nestegg_codec_in_given_key", default=False
)
"""True while :func:`rebuild_given` rebuilds a dict's key: an enum there that is not rebuilt
is refused, not made its plain value, which could be another key of the dict."""


_enums_kept: contextvars.ContextVar[str] = contextvars.ContextVar(
    "nestegg_codec_enums_kept", default=""
)
"""Under :func:`enums_kept`, which enums are read back as :class:`KeptEnum`: ``"all"`` or
``"unimported"``."""


@contextlib.contextmanager
def enums_kept(*, unimported_only: bool = False) -> Iterator[None]:
    """Within it, an enum member is read back as a :class:`KeptEnum`, which
    :func:`to_jsonable` writes back as it was stored: its module is not imported, so that
    a value printed in the codec's form (``nestegg inspect --stored``) is the stored one
    exactly, whether or not this process can import the enum's class. ``unimported_only``:
    only an enum whose class this process cannot import is (not made its plain value, so
    that ``diff`` tells it from that value); the others are rebuilt."""
    kept = _enums_kept.set("unimported" if unimported_only else "all")
    try:
        yield
    finally:
        _enums_kept.reset(kept)


class EnumKeyNotRebuilt(Exception):
    """An enum in a key someone gave whose class this process has not imported."""

    def __init__(self, where: str, key: Any = None) -> None:
        super().__init__(where)
        self.where, self.key = where, key


class DuplicateKeys(Exception):
    """A map someone gave whose ``entries`` hold one key twice, or a set or frozenset (its
    ``tag``) one item twice (``first`` and ``second``, as given, are equal once rebuilt:
    ``1`` and ``true``, say)."""

    def __init__(self, entries: list[Any], first: Any, second: Any, tag: str = "map") -> None:
        super().__init__(second)
        self.entries, self.first, self.second, self.tag = entries, first, second, tag


def _restore_enum(spec: list[Any]) -> Any:
    where, raw = spec
    kept = _enums_kept.get()
    if kept == "all":
        return KeptEnum(str(where), orjson.dumps(raw).decode())
    value = from_jsonable(raw)
    module, _, qualname = str(where).partition(":")
    target = named_object(module, qualname, importing=_imports_allowed.get())
    if isinstance(target, type) and issubclass(target, Enum):
        return target(value)
    if _in_given_key.get():
        raise EnumKeyNotRebuilt(str(where))
    return KeptEnum(str(where), orjson.dumps(raw).decode()) if kept else value


def _restore_map(entries: list[Any]) -> dict[Any, Any]:
    if _imports_allowed.get():
        return {from_jsonable(k): from_jsonable(x) for k, x in entries}
    rebuilt: dict[Any, Any] = {}
    given: dict[Any, Any] = {}  # each key as it was given
    for raw, item in entries:
        key = _given_key(raw)
        if key in rebuilt:  # given data keeps every entry, or is refused
            raise DuplicateKeys(entries, given[key], raw)
        rebuilt[key], given[key] = from_jsonable(item), raw
    return rebuilt


def _restore_set(items: list[Any], tag: str) -> set[Any] | frozenset[Any]:
    kind = set if tag == "set" else frozenset
    if _imports_allowed.get():
        return kind(from_jsonable(x) for x in items)
    given: dict[Any, Any] = {}  # each item rebuilt, as it was given
    for raw in items:
        item = from_jsonable(raw)
        if item in given:  # given data keeps every item, or is refused
            raise DuplicateKeys(items, given[item], raw, tag)
        given[item] = raw
    return kind(given)


def _given_key(raw: Any) -> Any:
    """A key of a dict someone gave, rebuilt; an enum in it must be rebuilt too."""
    inside = _in_given_key.set(True)
    try:
        return from_jsonable(raw)
    except EnumKeyNotRebuilt as error:
        raise EnumKeyNotRebuilt(error.where, raw) from None
    finally:
        _in_given_key.reset(inside)


_DECODERS: dict[str, Any] = {
    "datetime": datetime_from,
    "date": dt.date.fromisoformat,
    "time": time_from,
    "timedelta": lambda v: dt.timedelta(days=v[0], seconds=v[1], microseconds=v[2]),
    "uuid": uuid.UUID,
    "decimal": Decimal,
    "bytes": functools.partial(base64.b64decode, validate=True),  # what b64encode writes
    "int": int,
    "float": float,
    "enum": _restore_enum,
    "tuple": lambda v: tuple(from_jsonable(x) for x in v),
    "set": functools.partial(_restore_set, tag="set"),
    "frozenset": functools.partial(_restore_set, tag="frozenset"),
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


DAMAGED_TAG = (KeyError, TypeError, ValueError, IndexError, ArithmeticError)
"""What rebuilding a tagged object that is not one :func:`to_jsonable` writes raises."""


def rebuild_given(value: Any) -> Any:
    """JSON someone gave rebuilt as :func:`from_jsonable` rebuilds what the codec stored,
    importing no module (an enum of one not imported is its plain value), keeping every
    entry of a map; :func:`nestegg.checkpoint.given.given_data` says what is wrong.

    Raises:
        EnumKeyNotRebuilt: a dict's key holds an enum of no module this process imported.
        DuplicateKeys: a map holds one key twice, a set or frozenset one item twice.
        KeyError, TypeError, ValueError, IndexError, ArithmeticError: a tagged object
            the codec does not write (DAMAGED_TAG).
    """
    allowed = _imports_allowed.set(False)
    try:
        return from_jsonable(value)
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


_UNORDERED = ("set", "frozenset")


def sets_in_order(tree: Any, *, maps: bool = False) -> Any:
    """A :func:`to_jsonable` tree with the items of each set in it sorted by their JSON
    (with ``maps``, each map's entries too): the same text for equal values in every
    process (``nestegg inspect --stored`` prints it)."""
    if type(tree) is list:
        return [sets_in_order(item, maps=maps) for item in tree]
    if type(tree) is not dict:
        return tree
    tag = tree.get(TAG)  # the codec escapes a dict of one's own with this key
    if tag in _UNORDERED or (maps and tag == "map"):
        items = [sets_in_order(item, maps=maps) for item in tree["v"]]
        return {TAG: tag, "v": sorted(items, key=orjson.dumps)}
    return {k: sets_in_order(v, maps=maps) for k, v in tree.items()}


def same_stored(first: Any, second: Any) -> bool:
    """Whether two trees as :func:`to_jsonable` writes them (or as stored JSON reads back)
    hold one value: a dict's keys, a map's entries and a set's items in any order; two
    NaNs are one value (tagged alike), ``1`` and ``true`` two, as are ``1.0`` and
    ``1.00`` as Decimals (what is stored tells them apart)."""
    same = orjson.dumps(first) == orjson.dumps(second)
    return same or _unordered_json(first) == _unordered_json(second)


def _unordered_json(tree: Any) -> bytes:
    return orjson.dumps(sets_in_order(tree, maps=True), option=orjson.OPT_SORT_KEYS)


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
    except DAMAGED_TAG as exc:
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
