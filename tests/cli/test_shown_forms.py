"""What the commands show reads back as what it shows: a dict of one's own that looks like
a tag, or with a frozenset or tuple key, given back to ``nestegg fork --data``, is that
dict; a NaN key is one key to ``diff``; every path into a set or a frozenset key selects
what it names, in every process."""

from __future__ import annotations

import asyncio
import datetime as dt
import math
import os
import re
import subprocess
import sys
import uuid
from decimal import Decimal
from enum import Enum
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import orjson
import pytest

from nestegg.checkpoint.given import from_given
from nestegg.checkpoint.stores import open_store
from nestegg.cli.diff import diff_values, types_told
from nestegg.cli.paths import select
from nestegg.cli.reading import resolve_state
from nestegg.cli.render import plain, to_json
from nestegg.constants import EXIT_OK, EXIT_USAGE, HOME_ENV, STORE_ENV
from nestegg.errors import ConfigurationError
from tests.cli.test_subprocess import ROOT

TIMEOUT = 60
APP_MODULE = "kept_app"
APP_SOURCE = """
from enum import Enum

from nestegg import Clutch, Strategy
from nestegg.checkpoint import CheckpointConfig, CheckpointPolicy


class Tone(Enum):
    LOW = "low"


def build(storage=None):
    policy = CheckpointPolicy(every_n_steps=1, keep_latest=None)
    config = CheckpointConfig(storage=storage, policy=policy)
    clutch = Clutch("kept", strategy=Strategy.SEQUENTIAL, checkpoint=config)

    @clutch.agent()
    async def first(data):
        return data

    @clutch.agent()
    async def second(data):
        return data

    return clutch


pipeline = build()
"""


class Store:
    """A store with one run per id of the app's pipeline, whose agents keep their data,
    and the command run on it in the app module's folder."""

    def __init__(self, folder: Path, runs: dict[str, Any]) -> None:
        (folder / f"{APP_MODULE}.py").write_text(APP_SOURCE)
        self.folder = folder
        self.url = f"sqlite:///{folder / 'runs.db'}"
        asyncio.run(self._fill(runs))

    async def _fill(self, runs: dict[str, Any]) -> None:
        namespace: dict[str, Any] = {}
        exec(APP_SOURCE, namespace)  # the app's pipeline, built on this store
        store = open_store(self.url)
        try:
            clutch = namespace["build"](storage=store)
            for run_id, data in runs.items():
                await clutch.run(data, run_id=run_id)
        finally:
            await store.close()

    def run(self, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
        base = {k: v for k, v in os.environ.items() if k not in (STORE_ENV, "PYTHONPATH")}
        return subprocess.run(
            [sys.executable, "-m", "nestegg.cli", *args, "--store", self.url],
            cwd=self.folder,
            env={**base, "PYTHONPATH": str(ROOT), HOME_ENV: str(self.folder / "home"), **env},
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
        )

    def out(self, *args: str, **env: str) -> str:
        done = self.run(*args, **env)
        assert done.returncode == EXIT_OK, done.stderr
        return done.stdout

    def checkpoints(self, run_id: str) -> list[str]:
        rows = orjson.loads(self.out("checkpoints", run_id, "--json"))
        return [row["checkpoint_id"] for row in rows]

    def data(self, run_id: str) -> Any:
        async def load() -> Any:
            store = open_store(self.url)
            try:
                return (await resolve_state(store, run_id)).data
            finally:
                await store.close()

        return asyncio.run(load())


def _line(text: str, name: str) -> str:
    """The value of a ``name: value`` line of ``nestegg show``."""
    [value] = [line.partition(":")[2] for line in text.splitlines() if line.startswith(name)]
    return value.strip()


def _forked(store: Store, checkpoint: str, text: str, where: str) -> Any:
    """The data of the run ``fork CHECKPOINT --data TEXT`` started (``text`` as ``where``
    showed it)."""
    args = ["fork", checkpoint, "--app", f"{APP_MODULE}:pipeline", "--data", text, "--json"]
    done = store.run(*args)
    assert done.returncode == EXIT_OK, (where, done.stderr)
    return store.data(orjson.loads(done.stdout)["run_id"])


OWN = {
    "lookalike": {"$ne": 1, "v": 2},
    "nested": {"items": [{"$ne": "tuple", "v": [1, 2]}], "one": {"$ne": "set"}, 1: "a"},
}
"""Dicts of one's own with a "$ne" key: one that reads as no tag, one that reads as a
tuple, inside others."""


@pytest.mark.parametrize("name", list(OWN))
def test_a_dict_with_a_tag_key_is_shown_as_it_reads_back(tmp_path: Path, name: str) -> None:
    store = Store(tmp_path, {"own": OWN[name], "empty": []})
    shown = store.out("show", "own")
    changed = store.out("diff", "empty", "own", "--path", "data")
    given = {
        "show input": _line(shown, "input"),
        "inspect": store.out("inspect", "own", "--path", "data"),
        "diff": changed.removeprefix("~ (state): [] -> "),
    }
    assert _line(shown, "result") == given["show input"] == given["diff"].strip()
    assert '"$ne":"map"' in given["show input"]  # as the codec escapes it
    first = store.checkpoints("own")[0]
    for where, text in given.items():
        assert _forked(store, first, text, where) == OWN[name], where


KEYS = {
    frozenset({"delta", "alpha", "charlie", "bravo"}): 1,
    (1, frozenset({"y", "x", "z"})): 2,
    (1, 2): 3,
}
"""Keys that are no JSON value: a frozenset, a tuple holding one, a tuple."""
FROZEN = '{"$ne":"frozenset","v":["alpha","bravo","charlie","delta"]}'
"""The frozenset key as it is shown, its items in set_items's order."""


def test_a_frozenset_or_tuple_key_is_shown_as_it_reads_back(tmp_path: Path) -> None:
    store = Store(tmp_path, {"keys": KEYS})
    given = {
        "show input": _line(store.out("show", "keys"), "input"),
        "inspect": store.out("inspect", "keys", "--path", "data"),
        "inspect --json": store.out("inspect", "keys", "--path", "data", "--json"),
    }
    assert FROZEN in given["show input"]  # was ["alpha",...]: a list, which no key can be
    first = store.checkpoints("keys")[0]
    for where, text in given.items():
        assert _forked(store, first, text, where) == KEYS, where


TONE = Enum("Tone", {"LOW": "low"}, module=APP_MODULE)
"""The app module's enum, as it stores it (kept_app:Tone)."""
TYPED_KEYS = {
    dt.datetime(2024, 1, 2, 3, 4, 5): "datetime",
    "2024-01-02T03:04:05": "its text",
    dt.date(2024, 1, 2): "date",
    dt.time(3, 4, 5): "time",
    dt.timedelta(days=1): "timedelta",
    uuid.UUID(int=7): "uuid",
    Decimal("2.5"): "decimal",
    b"\x00\xff": "bytes",
    2**70: "an int past 64 bits",
    math.inf: "infinity",
    (dt.date(2024, 1, 2), b"x"): "a tuple of them",
}
"""Keys JSON has no value for, and a string that is one's plain value."""


class Mood(Enum):
    CALM = "calm"


@pytest.mark.parametrize("key", [*(k for k in TYPED_KEYS if type(k) is not str), Mood.CALM])
def test_a_key_json_has_no_value_for_reads_back_as_that_key(key: Any) -> None:
    data = {key: 1, "2024-01-02T03:04:05": 2, "calm": 3}
    for text in (to_json(data), to_json(data, strict=True)):
        assert text.count('"$ne"') > 1  # was its plain value, read back as another key
        given = from_given(orjson.loads(text), "--data")
        assert given == data and list(map(type, given)) == list(map(type, data))


def test_an_enum_key_of_a_module_not_imported_is_refused_not_made_another_key() -> None:
    shown = to_json({TONE.LOW: 1, "low": 2}, indent=False)  # kept_app is not imported here
    assert shown.startswith('{"$ne":"map","v":[[{"$ne":"enum","v":["kept_app:Tone","low"]},1]')
    with pytest.raises(ConfigurationError) as refused:
        from_given(orjson.loads(shown), "--data")
    assert str(refused.value).startswith(
        '--data holds the key {"$ne":"enum","v":["kept_app:Tone","low"]}, whose enum '
        "kept_app:Tone is of no module this process has imported (given data imports none)"
    )
    tuple_key = orjson.loads(to_json({(1, TONE.LOW): 1}))
    with pytest.raises(ConfigurationError, match=re.escape('the key {"$ne":"tuple"')):
        from_given(tuple_key, "--data")  # inside a tuple key too
    assert from_given(orjson.loads(to_json([TONE.LOW])), "--data") == ["low"]  # as a value


def test_an_unedited_fork_gives_back_keys_json_has_no_value_for(tmp_path: Path) -> None:
    store = Store(tmp_path, {"typed": TYPED_KEYS, "tone": {TONE.LOW: 1, "low": 2}})
    for run_id in ("typed", "tone"):
        inspected = store.out("inspect", run_id, "--path", "data", "--json")
        given = {
            "show input": _line(store.out("show", run_id), "input"),
            "inspect": store.out("inspect", run_id, "--path", "data"),
            "inspect --json": inspected,
        }
        first = store.checkpoints(run_id)[0]
        for where, text in given.items():
            args = ["fork", first, "--app", f"{APP_MODULE}:pipeline", "--data", text, "--json"]
            forked = orjson.loads(store.out(*args))["run_id"]
            again = store.out("inspect", forked, "--path", "data", "--json")
            assert again == inspected, where  # the app's enum key too: it imported its module
            if run_id == "typed":
                assert store.data(forked) == TYPED_KEYS, where


def test_fork_refuses_an_enum_key_of_a_module_the_app_does_not_import(tmp_path: Path) -> None:
    store = Store(tmp_path, {"tone": {TONE.LOW: 1}})
    key = '{"$ne":"enum","v":["json.tool:Tone","low"]}'  # json.tool has no Tone, nor is imported
    stranger = f'{{"$ne":"map","v":[[{key},1]]}}'
    first, runs = store.checkpoints("tone")[0], store.out("runs", "--json")
    done = store.run("fork", first, "--app", f"{APP_MODULE}:pipeline", "--data", stranger)
    assert (done.returncode, done.stdout) == (EXIT_USAGE, "")
    assert done.stderr.startswith(
        f"error: --data holds the key {key}, whose enum json.tool:Tone is of no "
        "module this process has imported"
    )
    assert store.out("runs", "--json") == runs  # nothing stored


def test_the_path_of_a_frozenset_key_is_the_same_in_every_process(tmp_path: Path) -> None:
    store = Store(tmp_path, {"none": {}, "keys": KEYS})
    shown = {
        seed: store.out("diff", "none", "keys", "--path", "data", PYTHONHASHSEED=seed)
        for seed in ("1", "2")
    }
    assert shown["1"] == shown["2"]  # a frozenset's order of strings changes with the seed
    paths = [f"data{line[2:].rpartition(': ')[0]}" for line in shown["1"].splitlines()]
    assert f"data[{FROZEN}]" in paths
    assert 'data[{"$ne":"tuple","v":[1,{"$ne":"frozenset","v":["x","y","z"]}]}]' in paths
    for path in paths:
        selected = store.out("inspect", "keys", "--path", path, "--json", PYTHONHASHSEED="3")
        assert orjson.loads(selected) == select({"data": KEYS}, path)


def test_a_nan_key_is_one_key_to_diff(tmp_path: Path) -> None:
    old, new = {float("nan"): 1, "a": 2}, {float("nan"): 1, "a": 2}  # two NaN objects
    assert diff_values(old, new) == []
    changes = diff_values(old, {float("nan"): 3, "a": 2})
    assert [(c.kind, c.path, c.old, c.new) for c in changes] == [("changed", "[NaN]", 1, 3)]
    nested = diff_values({(math.nan, 1): "x"}, {(float("nan"), 1): "x"})
    assert nested == []  # NaN inside a tuple key too

    store = Store(tmp_path, {"nan": {math.nan: "x", "n": 1}})
    last = store.checkpoints("nan")[-1]
    assert store.out("diff", last, last) == "no differences\n"  # each read on its own
    first = store.checkpoints("nan")[0]
    assert store.out("diff", first, last, "--path", "data") == "no differences\n"


def test_diff_takes_a_decimal_nan_for_itself_and_compares_a_signalling_one(
    tmp_path: Path,
) -> None:
    nans = {"d": Decimal("NaN"), "s": Decimal("sNaN"), "f": math.nan, "t": (Decimal("NaN"),)}
    assert diff_values(nans, {**nans, "d": Decimal("NaN"), "s": Decimal("sNaN")}) == []
    changes = diff_values(
        {"d": Decimal("1.0"), "s": Decimal("sNaN")}, {"d": Decimal("1.00"), "s": Decimal("NaN")}
    )
    assert [(c.path, str(c.old), str(c.new)) for c in changes] == [
        ("d", "1.0", "1.00"),  # equal numbers, not the same stored value
        ("s", "sNaN", "NaN"),  # an sNaN raises when compared
    ]

    store = Store(tmp_path, {"nans": nans})
    first, last = store.checkpoints("nans")[0], store.checkpoints("nans")[-1]
    assert store.out("diff", last, last) == "no differences\n"
    assert store.out("diff", first, last, "--path", "data") == "no differences\n"


SETS = {
    "tags": {"delta", "alpha", "charlie", "bravo"},
    "pairs": {("b", 2), ("a", 1)},
    "frozen": frozenset({frozenset({"y", "x"}), frozenset({"z"})}),
}


def _paths(value: Any, path: str) -> list[tuple[str, Any]]:
    """Every path into ``value`` (as plain JSON, as shown) with what it shows."""
    found = [(path, value)]
    if isinstance(value, list):
        for index, item in enumerate(value):
            found += _paths(item, f"{path}[{index}]")
    elif isinstance(value, dict):
        for key, item in value.items():
            found += _paths(item, f"{path}.{key}")
    return found


def test_a_set_item_has_a_path_that_selects_it() -> None:
    state = {"data": SETS}
    assert select(state, "data.tags[0]") == "alpha"
    assert select(state, "data.tags[3]") == "delta"
    assert select(state, "data.pairs[1][0]") == "b"
    assert select(state, "data.frozen[0][1]") == "y"  # ["z"] sorts after ["x","y"]


def test_every_path_into_a_set_that_inspect_shows_selects_it(tmp_path: Path) -> None:
    store = Store(tmp_path, {"sets": SETS})
    shown = orjson.loads(store.out("inspect", "sets", "--path", "data", "--json"))
    assert shown["tags"] == ["alpha", "bravo", "charlie", "delta"]
    again = store.out("inspect", "sets", "--path", "data", "--json", PYTHONHASHSEED="1")
    assert orjson.loads(again) == shown  # a set's order of strings changes with the seed
    paths = _paths(shown, "data")
    assert ("data.frozen[0][1]", "y") in paths
    state = {"data": store.data("sets")}  # read in this process, as a command reads it
    assert all(plain(select(state, path)) == value for path, value in paths)
    for path in ("data.tags[1]", "data.frozen[0][1]"):
        selected = store.out("inspect", "sets", "--path", path, "--json", PYTHONHASHSEED="2")
        assert orjson.loads(selected) == dict(paths)[path]


TYPED = [dt.datetime(2024, 1, 2, tzinfo=dt.UTC), TONE.LOW, (1, 2), {"x"}, 1, (dt.date(2024, 1, 2),)]
"""Values that, changed to ``AS_TEXT``'s, show the same text."""
AS_TEXT = ["2024-01-02T00:00:00+00:00", "low", [1, 2], ["x"], True, ("2024-01-02",)]


def test_diff_names_the_types_of_a_change_that_shows_the_same_text(tmp_path: Path) -> None:
    store = Store(tmp_path, {"typed": {"vals": TYPED}, "text": {"vals": AS_TEXT}})
    assert store.out("diff", "typed", "text", "--path", "data").splitlines() == [
        '~ vals[0]: "2024-01-02T00:00:00+00:00" (datetime) -> "2024-01-02T00:00:00+00:00" (str)',
        '~ vals[1]: "low" (Tone) -> "low" (str)',  # were the same text, no type
        "~ vals[2]: [1,2] (tuple) -> [1,2] (list)",
        '~ vals[3]: ["x"] (set) -> ["x"] (list)',
        "~ vals[4]: 1 -> true",  # the texts tell them apart
        '~ vals[5]: ["2024-01-02"] (tuple of date) -> ["2024-01-02"] (tuple of str)',
    ]


def test_diff_json_names_the_types_of_a_change_whose_values_are_the_same(
    tmp_path: Path,
) -> None:
    typed = {"vals": [*TYPED, math.nan, ((1,), [2])]}
    text = {"vals": [*AS_TEXT, "NaN", ([1], (2,))]}
    store = Store(tmp_path, {"typed": typed, "text": text})
    report = orjson.loads(store.out("diff", "typed", "text", "--path", "data", "--json"))
    told = [(c["path"], c.get("old_type"), c.get("new_type")) for c in report["changed"]]
    assert told == [
        ("vals[0]", "datetime", "str"),  # was old == new, nothing to tell them apart
        ("vals[1]", "Tone", "str"),
        ("vals[2]", "tuple", "list"),
        ("vals[3]", "set", "list"),
        ("vals[4]", None, None),  # 1 -> true: the values tell
        ("vals[5]", "tuple of date", "tuple of str"),
        ("vals[6]", "float", "str"),  # "NaN" -> "NaN" with --json (NaN -> "NaN" as text)
        ("vals[7]", "tuple[tuple[int], list[int]]", "tuple[list[int], tuple[int]]"),
    ]
    assert report["changed"][1] == {
        "path": "vals[1]",
        "old": "low",
        "new": "low",
        "old_type": "Tone",
        "new_type": "str",
    }
    assert report["changed"][4] == {"path": "vals[4]", "old": 1, "new": True}


def test_types_told_only_when_the_texts_are_the_same() -> None:
    assert types_told(1, "1", "1", '"1"') is None
    assert types_told("a" * 9, "a" * 8, '"aaa…"', '"aaa…"') is None  # one type: none to tell
    assert types_told(TONE.LOW, Mood.CALM, '"low"', '"low"') == ("Tone", "Mood")
    other = Enum("Tone", {"LOW": "low"}, module="other_app")
    told = ("kept_app.Tone", "other_app.Tone")  # two classes of one name
    assert types_told(TONE.LOW, other.LOW, '"low"', '"low"') == told
    nested = types_told(((1,),), ([1],), "[[1]]", "[[1]]")
    assert nested == ("tuple of int, tuple", "tuple of int, list")
    swapped = types_told(((1,), [2]), ([1], (2,)), "[[1],[2]]", "[[1],[2]]")
    assert swapped == ("tuple[tuple[int], list[int]]", "tuple[list[int], tuple[int]]")
    moved = types_told((TONE.LOW, "low"), ("low", TONE.LOW), '["low","low"]', '["low","low"]')
    assert moved == ("tuple[Tone, str]", "tuple[str, Tone]")  # the same types, moved


def test_inspect_and_diff_show_a_datetime_in_its_time_zone(tmp_path: Path) -> None:
    berlin = dt.datetime(2026, 10, 25, 2, 30, tzinfo=ZoneInfo("Europe/Berlin"), fold=1)
    fixed = berlin.astimezone(dt.timezone(dt.timedelta(hours=1)))  # the same instant
    store = Store(tmp_path, {"zoned": {"at": berlin}, "fixed": {"at": fixed}})
    shown = orjson.loads(store.out("inspect", "zoned", "--path", "data.at", "--json"))
    assert shown == "2026-10-25T02:30:00+01:00[Europe/Berlin]"
    stored = store.out("inspect", "zoned", "--path", "data", "--stored")
    assert orjson.loads(stored) == {
        "at": {"$ne": "datetime", "v": "2026-10-25T02:30:00+01:00[Europe/Berlin]"}
    }
    assert store.out("diff", "zoned", "fixed", "--path", "data").splitlines() == [
        '~ at: "2026-10-25T02:30:00+01:00[Europe/Berlin]" -> "2026-10-25T02:30:00+01:00"'
    ]
