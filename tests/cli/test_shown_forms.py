"""What the commands show reads back as what it shows: a dict of one's own that looks like
a tag, or with a frozenset or tuple key, given back to ``nestegg fork --data``, is that
dict; a NaN key is one key to ``diff``; every path into a set or a frozenset key selects
what it names, in every process."""

from __future__ import annotations

import asyncio
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest

from nestegg.checkpoint.stores import open_store
from nestegg.cli.diff import diff_values
from nestegg.cli.paths import select
from nestegg.cli.reading import resolve_state
from nestegg.cli.render import plain
from nestegg.constants import EXIT_OK, HOME_ENV, STORE_ENV
from tests.cli.test_subprocess import ROOT

TIMEOUT = 60
APP_MODULE = "kept_app"
APP_SOURCE = """
from nestegg import Clutch, Strategy
from nestegg.checkpoint import CheckpointConfig, CheckpointPolicy


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
