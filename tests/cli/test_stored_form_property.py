"""``nestegg inspect --stored`` and ``nestegg fork --data``, over many values: what the
first prints of a stored value, the second takes (no cut refused) and reads back as that
value, stored the same."""

from __future__ import annotations

import datetime as dt
import enum
from typing import Any

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nestegg.checkpoint.codec import (
    decode_value,
    encode_value,
    enums_kept,
    sets_in_order,
    to_jsonable,
)
from nestegg.checkpoint.given import from_given
from nestegg.cli.render import cut_at, dump_json


class Shade(enum.Enum):
    DARK = 1
    LIGHT = "light"


_MARKS = st.sampled_from(
    [
        "… (3 more items; --full shows all)",
        "notes: … (12 more characters; --full shows all)",
        "7 more keys; --full shows all",
        "a log line: 7 more keys; --full shows all",
    ]
)
_MINUTES = st.integers(-23 * 60, 23 * 60).map(lambda m: dt.timedelta(minutes=m))
_OFFSETS = st.builds(dt.timezone, _MINUTES)
"""Offsets of whole minutes: a zone's name is not stored (its offset is), as for every
stored datetime."""
_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**80), max_value=2**80)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(st.characters(exclude_categories=("Cs",)), max_size=12)
    | _MARKS
    | st.datetimes(timezones=st.none() | _OFFSETS)
    | st.dates()
    | st.times()
    | st.timedeltas()
    | st.uuids()
    | st.decimals(allow_nan=True, allow_infinity=True)
    | st.binary(max_size=12)
    | st.sampled_from(Shade)
)
_KEYS = (
    st.text(max_size=6, alphabet="ab$ne…")
    | st.integers(-3, 3)
    | st.booleans()
    | st.sampled_from(Shade)
    | st.tuples(st.integers(0, 2), st.text(max_size=2))
    | st.frozensets(st.integers(0, 3), max_size=3)
    | st.dates()
    | st.binary(max_size=3)
)
_VALUES = st.recursive(
    _SCALARS,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.tuples(inner, inner)
        | st.dictionaries(_KEYS, inner, max_size=4)
        | st.frozensets(st.integers(0, 9) | st.text(max_size=3), max_size=4)
        | st.sets(st.uuids() | st.dates(), max_size=3)
    ),
    max_leaves=12,
)


def _stored_form(value: Any) -> str:
    """What ``inspect --stored`` prints of ``value`` once stored."""
    with enums_kept():
        read = decode_value(encode_value(value))
        return dump_json(sets_in_order(to_jsonable(read)))


def _canonical(value: Any) -> bytes:
    return orjson.dumps(sets_in_order(to_jsonable(value)))


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(st.text(max_size=4), _VALUES, max_size=4))
def test_fork_reads_back_what_inspect_stored_prints(value: dict[str, Any]) -> None:
    text = _stored_form(value)
    given_json = orjson.loads(text)
    assert cut_at(given_json) is None  # nothing inspect --stored prints is refused as cut
    rebuilt = from_given(given_json, "--data")
    assert _canonical(rebuilt) == _canonical(value)
    assert _stored_form(rebuilt) == text
    if "nan" not in repr(value).lower():  # a NaN is equal to no value, itself neither
        assert rebuilt == value


def test_a_string_of_ones_own_that_ends_as_a_cut_one_does_is_taken() -> None:
    for text in (
        "a log line: 7 more keys; --full shows all",
        "notes: … (12 more characters; --full shows all)",
        "… (3 more items; --full shows all)",
    ):
        data = {"log": [text], "last": text, "…": text}
        assert cut_at(orjson.loads(_stored_form(data))) is None
        assert from_given(orjson.loads(_stored_form(data)), "--data") == data
