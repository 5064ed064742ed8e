"""The codec: exact round trips of stored values, paths in errors, sealed records."""

from __future__ import annotations

import datetime as dt
import math
import socket
import sys
import time
import uuid
from decimal import Decimal
from enum import Enum, Flag, IntEnum, StrEnum
from typing import Any
from zoneinfo import ZoneInfo

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ConfigDict

from nestegg.checkpoint import codec
from nestegg.checkpoint.codec import (
    TAG,
    all_intact,
    decode_value,
    encode_value,
    seal,
    seal_json,
    unseal,
    unseal_json,
)
from nestegg.checkpoint.given import from_given
from nestegg.errors import (
    CheckpointCorruptedError,
    CheckpointSerializationError,
    ConfigurationError,
    RecordTooLargeError,
)


class Color(Enum):
    RED = "red"
    GREEN = 2
    PAIR = (1, "x")


class Level(IntEnum):
    LOW = 1
    HIGH = 10


class Mode(StrEnum):
    FAST = "fast"
    SAFE = "safe"


class Perm(Flag):
    READ = 1
    WRITE = 2


class Address(BaseModel):
    street: str
    tags: set[str]
    zone: tuple[int, int]


class Order(BaseModel):
    order_id: uuid.UUID
    placed: dt.datetime
    due: dt.date
    at: dt.time
    wait: dt.timedelta
    price: Decimal
    blob: bytes
    color: Color
    level: Level
    address: Address
    lines: list[Address]
    counts: dict[int, str]
    extra: dict[str, Any]


class Holder(BaseModel):
    model_config = ConfigDict(arbitrary_types_allowed=True)

    client: Any


# --- exact comparison -------------------------------------------------------------------


def assert_same(a: Any, b: Any, path: str = "value") -> None:
    """``a`` and ``b`` are the same value of the same type (NaN equals NaN, -0.0 is not 0.0)."""
    assert type(a) is type(b), f"{path}: {type(a).__name__} became {type(b).__name__}"
    if isinstance(a, float):
        assert (math.isnan(a) and math.isnan(b)) or (
            a == b and math.copysign(1, a) == math.copysign(1, b)
        ), f"{path}: {a!r} became {b!r}"
    elif isinstance(a, Decimal):
        assert a.as_tuple() == b.as_tuple(), f"{path}: {a!r} became {b!r}"
    elif isinstance(a, list | tuple):
        assert len(a) == len(b), f"{path}: length {len(a)} became {len(b)}"
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_same(x, y, f"{path}[{i}]")
    elif isinstance(a, dict):
        assert len(a) == len(b), f"{path}: {len(a)} keys became {len(b)}"
        for (ka, va), (kb, vb) in zip(a.items(), b.items(), strict=True):
            assert_same(ka, kb, f"{path}.<key>")
            assert_same(va, vb, f"{path}[{ka!r}]")
    elif isinstance(a, dt.datetime | dt.time):
        assert a == b and a.utcoffset() == b.utcoffset(), f"{path}: {a!r} became {b!r}"
        assert a.tzinfo is None or b.tzinfo is not None, f"{path}: lost its time zone"
    elif isinstance(a, Enum):
        assert a is b, f"{path}: {a!r} became {b!r}"
    elif isinstance(a, set | frozenset):
        assert a == b, f"{path}: {a!r} became {b!r}"
        for item in a:
            assert_same(item, next(other for other in b if other == item), f"{path}{{}}")
    else:
        assert a == b, f"{path}: {a!r} became {b!r}"


def round_trip(value: Any) -> Any:
    decoded = decode_value(encode_value(value))
    assert_same(value, decoded)
    return decoded


# --- strategies -------------------------------------------------------------------------

# Whole-second offsets: fromisoformat drops the microseconds of an offset like +00:00:00.000001.
fixed_zones = st.integers(min_value=-86_399, max_value=86_399).map(
    lambda seconds: dt.timezone(dt.timedelta(seconds=seconds))
)
hashable_scalars = st.one_of(
    st.integers(),
    st.text(max_size=8),
    st.floats(allow_nan=False),
    st.uuids(),
    st.dates(),
    st.tuples(st.integers(), st.text(max_size=4)),
    st.frozensets(st.integers(), max_size=3),
    st.sampled_from(list(Color) + list(Level) + list(Mode)),
)
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.integers(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(),
    st.datetimes(),
    st.datetimes(timezones=fixed_zones),
    st.dates(),
    st.times(),
    st.times(timezones=fixed_zones),
    st.timedeltas(),
    st.uuids(),
    st.decimals(allow_nan=True, allow_infinity=True),
    st.binary(),
    st.sampled_from(list(Color) + list(Level) + list(Mode) + list(Perm)),
)


def _containers(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(
        st.lists(children, max_size=5),
        st.tuples(children, children),
        st.lists(children, max_size=3).map(tuple),
        st.sets(hashable_scalars, max_size=4),
        st.frozensets(hashable_scalars, max_size=4),
        st.dictionaries(st.text(max_size=6), children, max_size=5),
        st.dictionaries(st.integers(), children, max_size=4),
        st.dictionaries(hashable_scalars, children, max_size=4),
        st.dictionaries(st.text(max_size=6), children, max_size=3).map(lambda d: {**d, TAG: 1}),
        st.dictionaries(st.sampled_from([TAG, "v"]), children),
    )


values = st.recursive(scalars, _containers, max_leaves=25)
plain_json_trees = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda children: st.lists(children) | st.dictionaries(st.text(), children),
    max_leaves=30,
)
json_trees = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda children: st.lists(children) | st.dictionaries(st.text(), children),
    max_leaves=30,
)


# --- round trips ------------------------------------------------------------------------


@given(json_trees)
def test_json_trees_round_trip(value: Any) -> None:
    round_trip(value)


@given(values)
@settings(suppress_health_check=[HealthCheck.too_slow])
def test_tagged_values_round_trip(value: Any) -> None:
    round_trip(value)


@given(st.datetimes(timezones=st.none() | fixed_zones))
def test_datetimes_round_trip_naive_and_aware(value: dt.datetime) -> None:
    decoded = round_trip(value)
    assert (decoded.tzinfo is None) == (value.tzinfo is None)


def test_zoneinfo_datetime_keeps_its_instant_offset_and_zone() -> None:
    value = dt.datetime(2024, 7, 1, 12, 30, 15, 123456, tzinfo=ZoneInfo("Europe/Paris"))
    encoded = encode_value(value)
    text = "2024-07-01T12:30:15.123456+02:00[Europe/Paris]"
    assert orjson.loads(encoded) == {TAG: "datetime", "v": text}
    decoded = decode_value(encoded)
    assert decoded == value and decoded.utcoffset() == dt.timedelta(hours=2)
    assert decoded.tzinfo is ZoneInfo("Europe/Paris")


BERLIN = ZoneInfo("Europe/Berlin")


@pytest.mark.parametrize(
    ("value", "text"),
    [  # the second 02:30 of the night the clocks go back, and the first
        (dt.datetime(2026, 10, 25, 2, 30, tzinfo=BERLIN, fold=1), "2026-10-25T02:30:00+01:00"),
        (dt.datetime(2026, 10, 25, 2, 30, tzinfo=BERLIN), "2026-10-25T02:30:00+02:00"),
        # 02:30 of the night the clocks go forward, which no clock shows: both folds
        (dt.datetime(2026, 3, 29, 2, 30, tzinfo=BERLIN), "2026-03-29T02:30:00+01:00"),
        (dt.datetime(2026, 3, 29, 2, 30, tzinfo=BERLIN, fold=1), "2026-03-29T02:30:00+02:00"),
    ],
)
def test_a_zoned_datetime_at_a_clock_change_keeps_its_fold(value: dt.datetime, text: str) -> None:
    assert orjson.loads(encode_value(value))["v"] == f"{text}[Europe/Berlin]"
    decoded = decode_value(encode_value(value))
    assert decoded.fold == value.fold and decoded.utcoffset() == value.utcoffset()
    assert decoded.tzinfo is BERLIN


def test_a_zoned_datetime_adds_a_day_across_a_clock_change_as_before_it_was_stored() -> None:
    value = dt.datetime(2026, 3, 28, 12, 0, tzinfo=BERLIN)  # +01:00, the next day +02:00
    decoded = decode_value(encode_value(value))
    later = decoded + dt.timedelta(days=1)
    assert later == value + dt.timedelta(days=1) and later.utcoffset() == dt.timedelta(hours=2)
    assert decoded.tzname() == "CET" and later.tzname() == "CEST"


@given(st.datetimes(timezones=st.timezones()))
@settings(suppress_health_check=[HealthCheck.too_slow])
def test_datetimes_in_any_zone_round_trip_in_their_zone(value: dt.datetime) -> None:
    decoded = decode_value(encode_value(value))
    assert decoded.tzinfo is value.tzinfo
    assert decoded.replace(tzinfo=None) == value.replace(tzinfo=None)
    assert decoded.utcoffset() == value.utcoffset()


def test_a_zoned_time_keeps_its_zone() -> None:
    value = dt.time(9, 15, tzinfo=BERLIN)
    assert orjson.loads(encode_value(value))["v"] == "09:15:00[Europe/Berlin]"
    assert decode_value(encode_value(value)).tzinfo is BERLIN


def test_a_datetime_stored_before_zones_were_named_reads_back_at_its_offset() -> None:
    stored = orjson.dumps({TAG: "datetime", "v": "2024-07-01T12:30:00+02:00"})
    decoded = decode_value(stored)
    assert decoded.utcoffset() == dt.timedelta(hours=2)
    assert decoded.tzinfo == dt.timezone(dt.timedelta(hours=2))


@pytest.mark.parametrize(
    "text",
    [
        "2024-07-01T12:30:00+02:00[Nowhere/Atlantis]",
        "2024-07-01T12:30:00+02:00[../etc]",
        "2024-07-01T12:30:00[Europe/Berlin]",
        "2024-07-01T12:30:00+02:00Europe/Berlin]",
    ],
)
def test_a_stored_datetime_with_a_bad_zone_is_damaged(text: str) -> None:
    with pytest.raises(CheckpointCorruptedError, match=r"^data of run 'r' holds a damaged value"):
        decode_value(orjson.dumps({TAG: "datetime", "v": text}), "data of run 'r'")


def test_given_data_takes_a_zoned_datetime_and_refuses_an_unknown_zone() -> None:
    given = {"at": {TAG: "datetime", "v": "2026-10-25T02:30:00+01:00[Europe/Berlin]"}}
    at = from_given(given, "--data")["at"]
    assert at.tzinfo is BERLIN and at.fold == 1
    bad = {"at": {TAG: "datetime", "v": "2026-10-25T02:30:00+01:00[Nowhere/Atlantis]"}}
    with pytest.raises(ConfigurationError) as refused:
        from_given(bad, "--data")
    assert str(refused.value).startswith(
        '--data holds {"$ne":"datetime","v":"2026-10-25T02:30:00+01:00[Nowhere/Atlantis]"} at '
        'data.at, which is not a value the codec writes (its time zone "Nowhere/Atlantis" is not '
        'in this machine\'s time zone database: name an IANA time zone, as "Europe/Berlin")'
    )


@pytest.mark.parametrize(
    "value",
    [
        2**63,
        -(2**63) - 1,
        2**63 - 1,
        -(2**63),
        10**100,
        -(10**100),
        float("nan"),
        float("inf"),
        float("-inf"),
        -0.0,
        Decimal("NaN"),
        Decimal("-sNaN"),
        Decimal("-Infinity"),
        Decimal("1.2300E+7"),
        Decimal("-0.000"),
        b"",
        bytes(range(256)),
        bytearray(b"ab"),
        (),
        ((1,),),
        set(),
        frozenset({frozenset({1}), (2, 3)}),
        {1: "a", "1": "b", None: "c", False: "d", (1, 2): "e", 2.5: "f"},
        {TAG: "datetime", "v": "2024-01-01T00:00:00"},
        {TAG: "x"},
        {"v": 1, TAG: 2, "other": [TAG]},
        [TAG, {"nested": {TAG: None, "v": None}}],
        Color.PAIR,
        Perm.READ | Perm.WRITE,
        {Level.HIGH: Mode.FAST, Color.RED: [Color.GREEN]},
        dt.time(23, 59, 59, 999999, tzinfo=dt.timezone(dt.timedelta(seconds=-1))),
        dt.timedelta(days=-1, microseconds=1),
        dt.timedelta.max,
        dt.datetime.min,
        dt.datetime.max.replace(tzinfo=dt.UTC),
    ],
    ids=repr,
)
def test_edge_values_round_trip(value: Any) -> None:
    decoded = decode_value(encode_value(value))
    if isinstance(value, bytearray):
        assert decoded == bytes(value)
    else:
        assert_same(value, decoded)


def _orders() -> st.SearchStrategy[Order]:
    address = st.builds(
        Address,
        street=st.text(),
        tags=st.sets(st.text(max_size=5), max_size=3),
        zone=st.tuples(st.integers(), st.integers()),
    )
    return st.builds(
        Order,
        order_id=st.uuids(),
        placed=st.datetimes(timezones=st.none() | fixed_zones),
        due=st.dates(),
        at=st.times(),
        wait=st.timedeltas(),
        price=st.decimals(allow_nan=False, allow_infinity=False),
        blob=st.binary(),
        color=st.sampled_from(Color),
        level=st.sampled_from(Level),
        address=address,
        lines=st.lists(address, max_size=3),
        counts=st.dictionaries(st.integers(), st.text(max_size=3), max_size=3),
        extra=st.dictionaries(st.text(max_size=5), json_trees, max_size=3),
    )


@given(_orders())
@settings(suppress_health_check=[HealthCheck.too_slow])
def test_pydantic_model_dumps_round_trip(order: Order) -> None:
    dump = order.model_dump()
    decoded = round_trip(dump)
    assert Order.model_validate(decoded) == order
    assert_same(decode_value(encode_value(order)), dump)
    assert_same(decode_value(encode_value({"orders": [order]})), {"orders": [dump]})


def test_encoded_values_are_readable_json() -> None:
    raw = encode_value({"when": dt.date(2024, 5, 6), "n": 1})
    assert orjson.loads(raw) == {"when": {TAG: "date", "v": "2024-05-06"}, "n": 1}


def test_enum_of_a_module_that_is_gone_decodes_to_its_value() -> None:
    raw = encode_value(Color.RED).replace(Color.__module__.encode(), b"no_such_module_x")
    assert decode_value(raw) == "red"


# --- values that cannot be stored -------------------------------------------------------


def _unsupported(value: Any, path: str = "data") -> CheckpointSerializationError:
    with pytest.raises(CheckpointSerializationError) as caught:
        encode_value(value, path)
    return caught.value


def test_socket_deep_in_the_data_names_its_path_and_type() -> None:
    with socket.socket() as sock:
        error = _unsupported({"items": [1, 2, 3, {"client": sock, "ok": 1}]})
    assert error.path == "data.items[3].client"
    assert error.type_name == "socket"
    assert "data.items[3].client" in str(error) and "socket" in str(error)


@pytest.mark.parametrize(
    ("value", "path", "type_name"),
    [
        (lambda x: x, "data", "function"),
        ({"f": [lambda: 1]}, "data.f[0]", "function"),
        ({"t": (1, object())}, "data.t[1]", "object"),
        ({"s": frozenset({1j})}, "data.s[0]", "complex"),
        ({1: {"deep": [None, print]}}, "data[1].deep[1]", "builtin_function_or_method"),
        ({object(): 1}, "data.<key>", "object"),
        ({"$ne": {"x": [..., 1]}}, "data['$ne'].x[0]", "ellipsis"),
        ({"m": Holder(client=range(3))}, "data.m.client", "range"),
        ([1, 2, {"gen": (i for i in ())}], "data[2].gen", "generator"),
        ({"d": dt.UTC}, "data.d", "timezone"),
    ],
    ids=lambda v: v if isinstance(v, str) else type(v).__name__,
)
def test_unsupported_values_name_path_and_type(value: Any, path: str, type_name: str) -> None:
    error = _unsupported(value)
    assert (error.path, error.type_name) == (path, type_name)
    assert path in str(error) and type_name in str(error)


def test_the_root_path_is_the_callers() -> None:
    assert _unsupported({"client": object()}, "result").path == "result.client"


def test_a_value_over_the_record_limit_fails_naming_it_one_at_the_limit_is_stored(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(codec, "RECORD_MAX_BYTES", 12)
    assert encode_value(["x" * 6], "result of fetch") == b'["xxxxxx"]'
    assert encode_value("x" * 10) == b'"' + b"x" * 10 + b'"'
    with pytest.raises(RecordTooLargeError) as refused:
        encode_value(["x" * 9], "result of fetch")
    error = refused.value
    assert (error.path, error.type_name, error.size, error.limit) == (
        "result of fetch",
        "list",
        13,
        12,
    )


@pytest.mark.parametrize(
    "value", [10**4300 - 1, -(10**4300 - 1), 2**14000 + 1], ids=["4300 digits", "-4300", "2**14000"]
)
def test_an_int_of_up_to_4300_digits_round_trips(value: int) -> None:
    assert decode_value(encode_value({"v": [value]})) == {"v": [value]}


@pytest.mark.parametrize(
    ("value", "path"),
    [
        ({"a": 10**5000}, "data.a"),
        ([1, -(10**4300)], "data[1]"),
        ({1: {"n": 10**4300}}, "data[1].n"),
        ({"m": 1 << 10**7}, "data.m"),
    ],
    ids=["10**5000", "-10**4300", "under an int key", "2**(10**7)"],
)
def test_an_int_of_more_than_4300_digits_fails_naming_its_path(value: Any, path: str) -> None:
    error = _unsupported(value)
    assert (error.path, error.type_name) == (path, "int")
    assert f"at {path}: type int" in str(error) and "4,300 digits" in str(error)


def test_an_int_too_large_is_refused_by_its_size_without_writing_it_out() -> None:
    huge = 1 << 2 * 10**6
    before = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(0)  # no limit: writing this int out takes seconds
    try:
        started = time.perf_counter()
        assert _unsupported({"n": huge}).path == "data.n"
        assert time.perf_counter() - started < 1
        assert _unsupported(10**4300).type_name == "int"  # refused all the same
    finally:
        sys.set_int_max_str_digits(before)


def test_an_int_this_process_cannot_write_out_is_refused_naming_its_path() -> None:
    before = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(1000)
    try:
        error = _unsupported({"n": 10**2000})
    finally:
        sys.set_int_max_str_digits(before)
    assert (error.path, error.type_name) == ("data.n", "int")


class Unstorable(Enum):
    HANDLE = object()


def test_enum_with_an_unstorable_value_names_its_path() -> None:
    error = _unsupported({"flag": Unstorable.HANDLE})
    assert error.path.startswith("data.flag")
    assert error.type_name == "object"


@pytest.mark.parametrize(
    ("value", "path"),
    [
        ("\ud800", "data"),
        ({"a": ["ok", "x\udfffy"]}, "data.a[1]"),
        ({"k\udc80": 1}, "data"),
    ],
)
def test_lone_surrogates_fail_with_their_path(value: Any, path: str) -> None:
    error = _unsupported(value)
    assert error.path.startswith(path)
    assert isinstance(error, TypeError)


@pytest.mark.parametrize("depth", [300, 5000])
def test_values_nested_too_deep_fail_cleanly(depth: int) -> None:
    value: Any = []
    for _ in range(depth):
        value = [value]
    error = _unsupported(value)
    assert error.path.startswith("data")


def test_a_value_that_contains_itself_fails_cleanly() -> None:
    value: list[Any] = [1]
    value.append(value)
    _unsupported({"loop": value})


# --- sealed records ---------------------------------------------------------------------

SAMPLE = seal(encode_value({"data": {"items": [1, 2.5, "três", None]}, "turn": 7, "ok": True}))
FLIP_MASKS = (0x01, 0x10, 0x20, 0x80, 0xFF)


@given(st.binary())
def test_seal_and_unseal_round_trip_any_bytes(body: bytes) -> None:
    assert unseal(seal(body), "x") == body


@given(plain_json_trees)
def test_sealed_records_are_readable_json(value: Any) -> None:
    sealed = seal_json(value)
    assert_same(orjson.loads(sealed)["body"], value)
    assert_same(unseal_json(sealed, "x"), value)


def test_unseal_accepts_buffer_types() -> None:
    body = unseal(SAMPLE, "x")
    assert unseal(bytearray(SAMPLE), "x") == body
    assert unseal(memoryview(SAMPLE), "x") == body


def test_truncation_at_every_offset_is_detected() -> None:
    for size in range(len(SAMPLE)):
        torn = SAMPLE[:size]
        with pytest.raises(CheckpointCorruptedError, match="checkpoint 7"):
            unseal(torn, "checkpoint 7")
        with pytest.raises(CheckpointCorruptedError):
            unseal_json(torn, "checkpoint 7")


@pytest.mark.parametrize("tail", [b"}", b" ", b"\n", b"x}", SAMPLE])
def test_appended_bytes_are_detected(tail: bytes) -> None:
    with pytest.raises(CheckpointCorruptedError):
        unseal(SAMPLE + tail, "x")


@pytest.mark.parametrize("mask", FLIP_MASKS)
def test_a_flipped_byte_at_every_offset_is_detected(mask: int) -> None:
    for offset in range(len(SAMPLE)):
        altered = bytearray(SAMPLE)
        altered[offset] ^= mask
        with pytest.raises(CheckpointCorruptedError):
            unseal(bytes(altered), "x")
        with pytest.raises(CheckpointCorruptedError):
            unseal_json(bytes(altered), "x")


@given(st.binary(min_size=1), st.data())
def test_random_damage_never_leaks_a_decode_error(body: bytes, data: st.DataObject) -> None:
    sealed = seal(body)
    offset = data.draw(st.integers(0, len(sealed) - 1))
    replacement = data.draw(st.integers(0, 255).filter(lambda b: b != sealed[offset]))
    altered = sealed[:offset] + bytes([replacement]) + sealed[offset + 1 :]
    with pytest.raises(CheckpointCorruptedError):
        unseal_json(altered, "x")


@pytest.mark.parametrize(
    "body", [b"", b"not json", b"{", b'{"a":1', b"\xff\xfe", b"[1,]", b"NaN", b"{} {}"]
)
def test_unseal_json_of_a_body_that_is_not_json(body: bytes) -> None:
    sealed = seal(body)
    assert unseal(sealed, "x") == body
    with pytest.raises(CheckpointCorruptedError, match="event 3"):
        unseal_json(sealed, "event 3")


JUNK = [b"", b"{}", b"null", b"x" * 40, b'{"crc":"zzzzzzzz","body":1}']


@pytest.mark.parametrize("junk", JUNK)
def test_junk_is_not_a_record(junk: bytes) -> None:
    with pytest.raises(CheckpointCorruptedError):
        unseal(junk, "x")


# ------------------------------------------------- checking many records at once


def damaged_samples() -> list[bytes]:
    """SAMPLE torn at every offset, with each byte flipped, with bytes appended, and junk."""
    torn = [SAMPLE[:size] for size in range(len(SAMPLE))]
    flipped = [
        SAMPLE[:at] + bytes([SAMPLE[at] ^ mask]) + SAMPLE[at + 1 :]
        for at in range(len(SAMPLE))
        for mask in FLIP_MASKS
    ]
    appended = [SAMPLE + tail for tail in (b"}", b" ", b"x}", SAMPLE)]
    return [*torn, *flipped, *appended, *JUNK]


def test_all_intact_of_intact_records() -> None:
    assert all_intact([])
    assert all_intact([SAMPLE, seal(b""), seal(b"[1]"), SAMPLE])


def test_all_intact_finds_any_damaged_record_among_intact_ones() -> None:
    for damaged in damaged_samples():
        assert not all_intact([SAMPLE, damaged, SAMPLE]), damaged


@given(st.lists(st.binary(), max_size=5), st.binary(), st.data())
def test_all_intact_agrees_with_unseal(
    bodies: list[bytes], body: bytes, data: st.DataObject
) -> None:
    sealed = seal(body)
    offset = data.draw(st.integers(0, len(sealed) - 1))
    altered = sealed[:offset] + bytes([data.draw(st.integers(0, 255))]) + sealed[offset + 1 :]
    records = [*map(seal, bodies), altered]
    try:
        unseal(altered, "x")
    except CheckpointCorruptedError:
        assert not all_intact(records)
    else:
        assert all_intact(records)


class Tone(Enum):
    LOW = "low"


def test_given_data_rebuilds_enums_only_of_modules_already_imported() -> None:
    # what someone gave (a fork's data) never imports a module: an enum of one not loaded
    # stays its plain value; one of a loaded module is rebuilt, as stored data is
    loaded = {"$ne": "enum", "v": [f"{__name__}:Tone", "low"]}
    assert from_given({"t": loaded}, "--data") == {"t": Tone.LOW}
    name = "json.tool"  # importable, not imported by this test run
    assert name not in sys.modules
    unloaded = {"$ne": "enum", "v": [f"{name}:Whatever", "x"]}
    assert from_given({"t": unloaded}, "--data") == {"t": "x"}
    assert name not in sys.modules
    assert codec.from_jsonable({"t": loaded}) == {"t": Tone.LOW}  # stored data: as before


def test_stored_bytes_that_are_not_base64_are_damaged_not_dropped() -> None:
    # b64decode without validate dropped what is not base64: "@@@" read back as b""
    with pytest.raises(CheckpointCorruptedError, match="step 3 holds a damaged value"):
        decode_value(b'{"$ne":"bytes","v":"@@@"}', "step 3")
    assert decode_value(b'{"$ne":"bytes","v":"AP8="}') == b"\x00\xff"
