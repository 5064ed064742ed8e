"""``nestegg inspect --stored`` prints a checkpoint's data as ``nestegg fork --data`` reads it
back, exactly; what fork refuses to read back instead of forking with other data: a bare
NaN, a value inspect cut, a tagged object the codec does not write, an object's key or a
set's item given twice (each refusal says what to do, and stores nothing)."""

from __future__ import annotations

import datetime as dt
import math
import re
import uuid
from decimal import Decimal
from pathlib import Path
from typing import Any

import orjson
import pytest

from nestegg.checkpoint import codec
from nestegg.checkpoint import given as given_data
from nestegg.checkpoint.codec import (
    KeptEnum,
    enums_kept,
    from_jsonable,
    sets_in_order,
    to_jsonable,
)
from nestegg.checkpoint.given import from_given
from nestegg.cli.app import CommandError
from nestegg.cli.json_input import parse_json, read_json
from nestegg.cli.render import cut_at, readable, shorten, to_json
from nestegg.constants import CLI_VALUE_ITEMS as ITEMS
from nestegg.constants import EXIT_USAGE
from nestegg.errors import ConfigurationError
from tests.cli.test_shown_forms import APP_MODULE, TONE, Store

APP = f"{APP_MODULE}:pipeline"
EVERY_KIND = {
    "at": dt.datetime(2024, 1, 2, 3, 4, 5, 6, tzinfo=dt.timezone(dt.timedelta(hours=2))),
    "day": dt.date(2024, 1, 2),
    "clock": dt.time(3, 4, 5),
    "wait": dt.timedelta(days=1, seconds=2, microseconds=3),
    "id": uuid.UUID(int=7),
    "price": Decimal("1.50"),
    "raw": b"\x00\xffhi",
    "tone": TONE.LOW,
    TONE.LOW: "an enum key",
    "low": "its value as a key",
    "pair": (1, "a"),
    "tags": {"x", "y"},
    "frozen": frozenset({1}),
    "big": 2**70,
    "nan": math.nan,
    "infinities": [math.inf, -math.inf],
    1: "an int key",
    "own": {"$ne": "tuple", "v": [1]},
    "long": list(range(ITEMS + 1)),
    "text": "x" * 500,
}
"""Data of every kind JSON has no type for, and values inspect cuts unless --full."""
NO_ENUM = {k: v for k, v in EVERY_KIND.items() if TONE.LOW not in (k, v) and k != "low"}
"""EVERY_KIND without its enum (its module is not imported here: it is read as "low")."""


def _stored(store: Store, reference: str) -> str:
    return store.out("inspect", reference, "--path", "data", "--stored")


def test_an_unedited_fork_of_inspect_stored_continues_with_the_same_data(tmp_path: Path) -> None:
    store = Store(tmp_path, {"every": EVERY_KIND})
    first = store.checkpoints("every")[0]
    text = _stored(store, first)
    assert '{\n  "$ne": "map"' in text and "--full shows all" not in text  # whole
    runs = []
    for data in ("--data", text), ("--data-file", str(tmp_path / "data.json")):
        (tmp_path / "data.json").write_text(text)
        args = ["fork", first, "--app", APP, *data, "--json"]
        runs.append(orjson.loads(store.out(*args))["run_id"])
    for forked in runs:
        assert _stored(store, forked) == text  # the enum too, its module never imported
        data = store.data(forked)
        assert {k: type(data[k]) for k in NO_ENUM} == {k: type(v) for k, v in NO_ENUM.items()}
        assert orjson.dumps(sets_in_order(to_jsonable({k: data[k] for k in NO_ENUM}))) == (
            orjson.dumps(sets_in_order(to_jsonable(NO_ENUM)))  # a set's items in any order
        )
    whole = orjson.loads(store.out("inspect", first, "--stored", "--json"))
    assert whole["data"] == orjson.loads(text)  # without --path: the whole state
    assert _stored(store, first) == text  # the same text in every process (a set's order)


def test_an_enum_read_under_enums_kept_is_written_back_as_stored() -> None:
    tagged = to_jsonable({TONE.LOW: [TONE.LOW], "low": 1})  # kept_app is not imported here
    with enums_kept():
        read = from_jsonable(tagged)
    kept = KeptEnum("kept_app:Tone", '"low"')
    assert read == {kept: [kept], "low": 1}  # not "low", which is another key
    assert to_jsonable(read) == tagged
    assert from_jsonable(tagged) == {"low": 1}  # otherwise: its plain value, as before


FORK_REFUSALS = {
    "nan": ('{"x": [1, NaN]}', "--data is not JSON: NaN, Infinity and -Infinity are not JSON "
            'numbers (line 1 column 11); give one as {"$ne":"float","v":"NaN"}'),
    "-infinity": ('{"x": -Infinity}', "--data is not JSON: NaN, Infinity and -Infinity"),
    "bad base64": ('{"x": {"$ne": "bytes", "v": "@@@"}}', '--data holds {"$ne":"bytes",'
                   '"v":"@@@"} at data.x, which is not a value the codec writes (its value '
                   "is not the bytes in base64"),
    "no v": ('{"x": [{"$ne": "map"}]}', '--data holds {"$ne":"map"} at data.x[0], which is '
             'not a value the codec writes (it has no "v": a \'map\' tag is {"$ne": "map", '
             '"v": a list of [key, value] pairs})'),
    "one key twice": ('{"$ne": "map", "v": [[1, "a"], [1, "b"]]}', "--data holds a map at "
                      "data with one key twice (1 is there twice): a dict has each key once"),
    "bad decimal": ('{"p": {"$ne": "decimal", "v": "1,5"}}', '--data holds {"$ne":"decimal",'
                    '"v":"1,5"} at data.p, which is not a value the codec writes (its value is '
                    'not a decimal number as a string ("1.50", "NaN"))'),
    "no pair": ('{"$ne": "map", "v": [["a", 1], [1]]}', '--data holds {"$ne":"map","v":[["a",'
                '1],[1]]} at data, which is not a value the codec writes (its value is not a '
                "list of [key, value] pairs)"),
}  # fmt: skip
"""--data, and how its refusal starts."""


@pytest.mark.parametrize("case", list(FORK_REFUSALS))
def test_fork_refuses_data_it_would_not_read_back_and_says_what_to_do(
    tmp_path: Path, case: str
) -> None:
    store = Store(tmp_path, {"plain": {"x": 1}})
    first, runs = store.checkpoints("plain")[0], store.out("runs", "--json")
    data, says = FORK_REFUSALS[case]
    done = store.run("fork", first, "--app", APP, "--data", data)
    assert (done.returncode, done.stdout) == (EXIT_USAGE, "")
    assert done.stderr.startswith(f"error: {says}")
    assert "Error" not in done.stderr and "<class" not in done.stderr  # plain words
    assert store.out("runs", "--json") == runs  # nothing stored


ONCE = "has each {0} once; give each {0} once"
TWICE = {
    "a key twice": ('{"x": 1, "y": [{"a": 1, "b": 2, "a": 3}]}', '--data holds a dict at '
                    'data.y[0] with one key twice ("a" is there twice): a dict '
                    + ONCE.format("key")),
    "a map value's key twice": ('{"$ne": "map", "v": [[1, {"k": 1, "k": 1}]]}', '--data holds '
                                'a dict at data[1] with one key twice ("k" is there twice): '
                                "a dict " + ONCE.format("key")),
    "a set's item twice": ('{"s": {"$ne": "set", "v": [1, 2, 1]}}', "--data holds a set at "
                           "data.s with one item twice (1 is there twice): a set "
                           + ONCE.format("item")),
    "a frozenset's": ('[{"$ne": "frozenset", "v": [1, true]}]', "--data holds a frozenset at "
                      "data[0] with one item twice (1 and true are one item): a frozenset "
                      + ONCE.format("item")),
}  # fmt: skip
"""--data with an object's key or a set's item twice, and its refusal (JSON readers keep an
object's last value, and a set is a set: the data would lose some of what it was given)."""


@pytest.mark.parametrize("case", list(TWICE))
def test_fork_refuses_a_key_or_an_item_given_twice_naming_where(tmp_path: Path, case: str) -> None:
    store = Store(tmp_path, {"plain": {"x": 1}})
    first, runs = store.checkpoints("plain")[0], store.out("runs", "--json")
    data, says = TWICE[case]
    (tmp_path / "twice.json").write_text(data)
    for given in (["--data", data], ["--data-file", "twice.json"]):
        done = store.run("fork", first, "--app", APP, *given)
        what = " ".join(given) if given[0] == "--data-file" else "--data"
        assert (done.returncode, done.stdout) == (EXIT_USAGE, "")
        assert done.stderr == f"error: {says.replace('--data', what, 1)}\n"
    assert store.out("runs", "--json") == runs  # nothing stored


def test_a_key_twice_is_found_wherever_it_is_and_only_there() -> None:
    for text, where in (
        ('{"$ne": "map", "v": [[{"$ne": "tuple", "v": [{"a": 1, "a": 1}]}, 1]]}', "data.<key>[0]"),
        ('{"$ne": "tuple", "$ne": "set", "v": []}', "data"),
        ('{"it\'s": {"$ne": "map", "v": [["k", [{"b": {"a": 1, "a": 2}}]]]}}',
         'data["it\'s"]["k"][0].b'),
    ):  # fmt: skip
        with pytest.raises(
            ConfigurationError, match=rf"^--data holds a dict at {re.escape(where)} "
        ):
            given_data.refuse_key_twice(text, "--data")
    given_data.refuse_key_twice('[{"a": 1}, {"a": 2, "b": {"a": 3}}]', "--data")  # once each
    given_data.refuse_key_twice(b'{"a": 1, "a"', "--data")  # not JSON: the reader says so


def test_a_key_twice_in_plain_json_is_named_from_its_top_reading_no_tag() -> None:
    # a signal's value or an export: a dict with a "$ne" key is a dict, not a tag
    for text, where in (
        ('{"$ne": "map", "v": [["k", {"a": 1, "a": 2}]]}', "v[0][1]"),
        ('{"a": 1, "b": 2, "a": 3}', "the top level"),
        ('[0, {"x y": {"a": 1, "a": 2}}]', '[1]["x y"]'),
    ):
        with pytest.raises(ConfigurationError, match=rf"^x holds a dict at {re.escape(where)} "):
            given_data.refuse_key_twice(text, "x", plain=True)
    given_data.refuse_key_twice('[{"a": 1}, {"a": 2, "b": {"a": 3}}]', "x", plain=True)


def test_fork_refuses_data_inspect_cut_naming_where(tmp_path: Path) -> None:
    data = {"x": 1, "steps": [{"notes": list(range(ITEMS + 5))}]}
    store = Store(tmp_path, {"cut": data})
    first, runs = store.checkpoints("cut")[0], store.out("runs", "--json")
    cut = store.out("inspect", first, "--path", "data")
    (tmp_path / "cut.json").write_text(cut)
    for given in (["--data", cut], ["--data-file", "cut.json"]):
        done = store.run("fork", first, "--app", APP, *given)
        assert (done.returncode, done.stdout) == (EXIT_USAGE, "")
        what = " ".join(given) if given[0] == "--data-file" else "--data"
        assert done.stderr.startswith(
            f"error: {what} holds at data.steps[0].notes[{ITEMS}] a value nestegg inspect cut "
        )
        assert "nestegg inspect CHECKPOINT --path data --stored" in done.stderr
    assert store.out("runs", "--json") == runs  # nothing stored
    whole = store.out("inspect", first, "--path", "data", "--full")
    assert _forked_data(store, first, whole) == data  # whole, it is taken


def _forked_data(store: Store, checkpoint: str, text: str) -> Any:
    args = ["fork", checkpoint, "--app", APP, "--data", text, "--json"]
    return store.data(orjson.loads(store.out(*args))["run_id"])


@pytest.mark.parametrize(
    ("value", "where"),
    [
        ("y" * 500, "data"),
        ({"a": [list(range(ITEMS + 1))]}, f"data.a[0][{ITEMS}]"),
        ({"k": {str(i): i for i in range(ITEMS + 1)}}, "data.k['…']"),
        ({"it's": "y" * 500}, 'data["it\'s"]'),
    ],
)
def test_cut_at_finds_every_cut_inspect_makes(value: Any, where: str) -> None:
    assert cut_at(orjson.loads(to_json(shorten(readable(value))))) == where
    assert cut_at(orjson.loads(to_json(value))) is None  # whole


def test_a_bare_nan_says_how_to_give_it(tmp_path: Path) -> None:
    (tmp_path / "nan.json").write_text('{"x": NaN}')
    for read in (
        lambda: parse_json('{"x": NaN}', "--data", "do this"),
        lambda: read_json(str(tmp_path / "nan.json"), "--data-file", "do this"),
    ):
        with pytest.raises(CommandError) as refused:
            read()
        assert "NaN, Infinity and -Infinity are not JSON numbers (line 1 column 7); do this" in (
            str(refused.value)
        )
    with pytest.raises(CommandError, match=r"^--data is not JSON \(unexpected character"):
        parse_json('{"x": [}', "--data", "do this")  # other text: as before


@pytest.mark.parametrize(
    ("given", "says"),
    [
        ({"b": {"$ne": "bytes", "v": "@@@"}}, "at data.b, which is not a value the codec "
         "writes (its value is not the bytes in base64"),
        ({"b": {"$ne": "bytes", "v": "A"}}, "its value is not the bytes in base64"),
        ([{"$ne": "map"}], 'at data[0], which is not a value the codec writes (it has no "v"'),
        ({"$ne": "set", "v": [], "w": 1}, 'at data, which is not a value the codec writes (it '
         'has other keys ("w")'),
        ({"$ne": "map", "v": [["k", 1], ["k", 2]]}, 'a map at data with one key twice ("k" is '
         "there twice)"),
        ({"m": {"$ne": "map", "v": [[1, "a"], [True, "b"]]}}, "a map at data.m with one key "
         "twice (1 and true are one key)"),
        ({"d": {"$ne": "decimal", "v": "x"}}, "at data.d, which is not a value the codec "
         'writes (its value is not a decimal number as a string ("1.50", "NaN"))'),
        ({"$ne": "map", "v": [[1]]}, "(its value is not a list of [key, value] pairs)"),
        ({"$ne": "map", "v": [["a", {"$ne": "uuid", "v": "u"}]]}, 'at data["a"], which is not '
         'a value the codec writes (its value is not a UUID'),
        ({"t": {"$ne": "timedelta", "v": [1, 2]}}, "(its value is not [days, seconds, "
         "microseconds], three integers)"),
        ({"$ne": "map", "v": [[[1], 2]]}, "at data.<key>, which is not a value the codec "
         "writes (a list, a dict or a set is no dict's key)"),
        ({"n": {"$ne": "int", "v": "7" * 5000}}, '{"$ne":"int","v":"..."} at data.n, which is '
         "not a value the codec writes (its value has 5,000 digits, more than Python reads "
         "back (4,300))"),
        ({"n": {"$ne": "int", "v": "1.5"}}, "(its value is not an integer's digits as a string"),
    ],
)  # fmt: skip
def test_a_malformed_tag_is_refused_in_plain_words_naming_where(given: Any, says: str) -> None:
    with pytest.raises(ConfigurationError) as refused:
        from_given(given, "--data")
    assert says in str(refused.value)
    for internal in ("InvalidOperation", "unpack", "Error", "<class"):
        assert internal not in str(refused.value)


def test_well_formed_tags_are_rebuilt_as_before() -> None:
    assert list(given_data._EXPECTED) == list(codec._DECODERS)  # every tag the codec reads
    tagged = to_jsonable(NO_ENUM | {"big": 2**63})
    rebuilt = from_given(orjson.loads(orjson.dumps(tagged)), "--data")
    # a set rebuilt from its items may iterate them in another order (by the hash seed)
    assert orjson.dumps(sets_in_order(to_jsonable(rebuilt))) == orjson.dumps(sets_in_order(tagged))
    assert from_given({"b": {"$ne": "bytes", "v": ""}}, "--data") == {"b": b""}
