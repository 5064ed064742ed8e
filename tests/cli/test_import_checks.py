"""``nestegg import`` checks every id and field as ``run()`` does, on every store, and
writes nothing when one is refused."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

from nestegg.checkpoint import CheckpointConfig
from nestegg.checkpoint.codec import seal, unseal
from nestegg.checkpoint.stores import open_store
from nestegg.checkpoint.stores.base import CheckpointStorage
from nestegg.cli.transfer import ExportFormatError, export_run, import_run
from nestegg.constants import EXIT_USAGE, MAX_NAME_LENGTH
from nestegg.errors import CheckpointExistsError, InvalidIdentifierError
from nestegg.testing import fixtures as store_fixtures
from tests.cli.conftest import Cli, Filled, fill, json_of
from tests.cli.pipeline_app import POLICY, build

# Every registered store (tests/registry.py), memory included, for the tests of import_run.
pytest_generate_tests = store_fixtures.parametrize_stores
store = store_fixtures.store
store_factory = store_fixtures.store_factory
store_name = store_fixtures.store_name

Edit = Callable[[dict[str, Any]], None]


def _set(*keys: Any, value: Any) -> Edit:
    def edit(document: dict[str, Any]) -> None:
        target = document
        for key in keys[:-1]:
            target = target[key]
        target[keys[-1]] = value

    return edit


def _twice(key: str, field: str) -> Edit:
    def edit(document: dict[str, Any]) -> None:
        records = document[key]
        records[1][field] = records[0][field]

    return edit


def _journal_entry_twice(document: dict[str, Any]) -> None:
    document["journal"].append(dict(document["journal"][0]))


def _signal(**fields: Any) -> Edit:
    def edit(document: dict[str, Any]) -> None:
        signal = {"name": "go", "at": 1.0, "body": document["events"][0]["body"]}
        document["signals"] = [{**signal, **fields}]

    return edit


def _signal_twice(document: dict[str, Any]) -> None:
    _signal()(document)
    document["signals"].append({**document["signals"][0], "at": 2.0})


def _in_body(*keys: Any, old: str, new: str) -> Edit:
    """An edit of the sealed record at ``keys``, sealed again: its checksum is right."""

    def edit(document: dict[str, Any]) -> None:
        target = document
        for key in keys[:-1]:
            target = target[key]
        body = unseal(target[keys[-1]].encode(), "the edited record")
        assert old.encode() in body
        target[keys[-1]] = seal(body.replace(old.encode(), new.encode(), 1)).decode()

    return edit


def _key_twice(keys: tuple[Any, ...], key: str, first: str, at: str = "") -> tuple[Edit, str]:
    """The record at ``keys`` given ``key`` twice (``first`` put before it, in the dict at
    ``at`` of its body), and the start of its refusal, naming the record, the path and key."""
    place = "".join(f"[{k}]" if isinstance(k, int) else f".{k}" for k in keys).lstrip(".")
    old = f'"{key}":'
    edit = _in_body(*keys, old=old, new=first + old)
    path = f"body.{at}" if at else "body"
    return edit, f'{place} holds a dict at {path} with one key twice ("{key}" is there twice)'


def _without(key: str, index: int, field: str) -> Edit:
    def edit(document: dict[str, Any]) -> None:
        del document[key][index][field]

    return edit


BAD_EDITS: dict[str, tuple[Edit, str]] = {
    "path in run id": (_set("run", "run_id", value="../escape"), "path separator"),
    "empty run id": (_set("run", "run_id", value=""), "non-empty"),
    "long run id": (_set("run", "run_id", value="r" * (MAX_NAME_LENGTH + 1)), "at most"),
    "line feed": (_set("run", "run_id", value="a\nb"), "contains a line feed (U+000A)"),
    "run id a number": (_set("run", "run_id", value=5), "run.run_id must be a non-empty"),
    "agent name": (_set("steps", 0, "agent", value="a/b"), "steps[0].agent 'a/b' contains"),
    "agent null": (_set("steps", 0, "agent", value=None), "steps[0].agent must be a non-empty"),
    "agent a number": (_set("steps", 1, "agent", value=7), "steps[1].agent must be a non-empty"),
    "checkpoint id": (_set("checkpoints", 0, "checkpoint_id", value=".."), "checkpoints[0]"),
    "parent run": (_set("run", "parent_run", value="x/y"), "run.parent_run 'x/y'"),
    "parent run a number": (_set("run", "parent_run", value=5), "run.parent_run must be"),
    "pipeline a number": (_set("run", "pipeline", value=5), "run.pipeline must be a non-empty"),
    "pipeline NUL": (_set("run", "pipeline", value="a\0b"), "run.pipeline 'a\\x00b' holds a NUL"),
    "status": (_set("run", "status", value="done"), "run.status 'done' is not one of running"),
    "status a list": (_set("run", "status", value=["running"]), "run.status ['running']"),
    "fence": (_set("run", "fence", value=0), "run.fence 0 is outside 1.."),
    "fence past 64 bits": (_set("run", "fence", value=2**63), f"run.fence {2**63} is outside"),
    "owner host": (_set("run", "owner", "host", value=1), "run.owner.host must be a non-empty"),
    "owner pid": (_set("run", "owner", "pid", value="12"), "run.owner.pid must be a whole"),
    "owner a list": (_set("run", "owner", value=[1]), "run.owner must be a JSON object"),
    "step seq": (_set("steps", 0, "seq", value=99), "steps[0].seq 99 is outside 1..3"),
    "step seq twice": (_twice("steps", "seq"), "steps[1]: seq 1 appears twice"),
    "step not an object": (_set("steps", 2, value=3), "steps[2] must be a JSON object, got 3"),
    "steps not a list": (_set("steps", value={"a": 1}), "steps must be a JSON list"),
    "step body missing": (_without("steps", 1, "body"), "steps[1].body is missing"),
    "no journal": (lambda document: document.pop("journal"), ": journal is missing"),
    "event seq": (_set("events", 0, "seq", value=0), "events[0].seq 0 is outside 1.."),
    "event seq twice": (_twice("events", "seq"), "events[1]: seq 1 appears twice"),
    "event kind": (_set("events", 2, "kind", value="bogus"), "events[2].kind 'bogus' is not"),
    "event kind a number": (_set("events", 0, "kind", value=5), "events[0].kind 5 is not one"),
    "event body": (_set("events", 1, "body", value=5), "events[1].body is neither a string"),
    "event body base64": (_set("events", 1, "body", value={"base64": "%"}), "events[1].body."),
    "journal step": (_set("journal", 0, "step", value=0), "journal[0].step 0 is outside 1.."),
    "journal entry twice": (_journal_entry_twice, "journal[1]: step and position (2, 0)"),
    "journal position": (_set("journal", 0, "position", value=-1), "journal[0].position -1"),
    "checkpoint seq": (_set("checkpoints", 1, "seq", value=4), "checkpoints[1].seq 4 is outside"),
    "checkpoint reason": (_set("checkpoints", 0, "reason", value=""), "checkpoints[0].reason ''"),
    "lease far off": (_set("run", "lease_until", value=1e300), "run.lease_until must be UNIX"),
    "created null": (_set("run", "created_at", value=None), "run.created_at must be UNIX"),
    "event time": (_set("events", 0, "at", value=-1), "events[0].at must be UNIX seconds"),
    "seq as text": (_set("steps", 0, "seq", value="1"), "steps[0].seq must be a whole number"),
    "fence as bool": (_set("run", "fence", value=True), "run.fence must be a whole number"),
    "checkpoint id twice": (
        _twice("checkpoints", "checkpoint_id"),
        "checkpoints[1]: checkpoint_id",
    ),
    "signal name": (_signal(name=None), "signals[0].name must be a non-empty string"),
    "signal name a path": (_signal(name="a/b"), "signals[0].name 'a/b' contains"),
    "signal time": (_signal(at="now"), "signals[0].at must be UNIX seconds"),
    "signal twice": (_signal_twice, "signals[1]: name 'go' appears twice"),
    "signals not a list": (_set("signals", value=5), "signals must be a JSON list, got 5"),
    # an object of a record's JSON with a key twice, whose last value the reader keeps
    "a key twice in the input": _key_twice(("run", "input"), "name", '"name":"x",'),
    "a key twice in a step": _key_twice(
        ("steps", 1, "body"), "size", '"size":"small",', "data.tags"
    ),
    "a key twice in a checkpoint": _key_twice(
        ("checkpoints", 0, "body"), "index", '"index":0,', "position"
    ),
    "a key twice in an event": _key_twice(("events", 1, "body"), "seq", '"seq":1,'),
    "a key twice in a journal entry": _key_twice(("journal", 0, "body"), "result", '"result":"",'),
    # a field that copies what the record's sealed body holds must still hold the same
    "agent not its body's": (
        _set("steps", 0, "agent", value="nope-agent"),
        "steps[0].agent 'nope-agent' is not what the record's sealed body holds, 'fetch'",
    ),
    "checkpoint seq not its body's": (
        _set("checkpoints", 1, "seq", value=1),
        "checkpoints[1].seq 1 is not what the record's sealed body holds, 2",
    ),
}


@pytest.mark.parametrize("case", list(BAD_EDITS))
def test_import_refuses_what_run_would_refuse(
    cli: Cli, any_url: str, tmp_path: Path, case: str
) -> None:
    document = asyncio.run(_source_document(tmp_path))
    edit, message = BAD_EDITS[case]
    bad = copy.deepcopy(document)
    edit(bad)
    path = tmp_path / "bad.json"
    path.write_bytes(orjson.dumps(bad))
    ids = {i for i in (document["run"]["run_id"], bad["run"]["run_id"]) if isinstance(i, str)}
    try:
        result = cli("import", str(path), "--store", any_url)
        assert result.exit_code == EXIT_USAGE, (result.stdout, result.stderr)
        assert message in result.stderr and len(result.stderr.splitlines()) == 1
        assert result.stderr.startswith(f"error: {path}: ")  # ids and names too: the file's
        listed = json_of(cli("runs", "--json", "--limit", "1000", "--store", any_url))
        assert not [row for row in listed if row["run_id"] in ids]  # nothing written
    finally:
        asyncio.run(_forget(any_url, ids))  # a shared server store keeps nothing of a failure


async def _forget(url: str, run_ids: set[str]) -> None:
    store = open_store(url)
    try:
        for run_id in run_ids:
            with contextlib.suppress(InvalidIdentifierError):
                await store.delete_run(run_id)
    finally:
        await store.close()


async def _source_document(tmp_path: Path) -> dict[str, Any]:
    url = f"sqlite:///{tmp_path / 'source.db'}"
    filled = await fill(url, f"-{uuid.uuid4().hex[:8]}")
    store = open_store(url)
    try:
        return await export_run(store, filled.ok)
    finally:
        await store.close()


@pytest.fixture
def any_url(any_url: str) -> str:
    """An existing store of every kind (so that listing it before the import works)."""

    async def create() -> None:
        store = open_store(any_url)
        await store.setup()
        await store.close()

    asyncio.run(create())
    return any_url


async def _run_and_a_copy(store: CheckpointStorage) -> tuple[dict[str, Any], dict[str, Any]]:
    """The export of a run "ok" stored in ``store``, and a copy of it as run "copy"."""
    clutch = build("cli-test", CheckpointConfig(storage=store, policy=POLICY))
    await clutch.run({"name": "Acme"}, run_id="ok")
    document = await export_run(store, "ok")
    copied = copy.deepcopy(document)
    copied["run"]["run_id"] = "copy"
    return document, copied


async def test_an_import_refuses_a_checkpoint_id_another_run_of_the_store_has(
    store: CheckpointStorage,
) -> None:
    document, copied = await _run_and_a_copy(store)  # the checkpoint ids kept: they are ok's
    taken = document["checkpoints"][0]["checkpoint_id"]
    with pytest.raises(CheckpointExistsError) as refused:
        await import_run(store, copied)
    assert str(refused.value) == (
        f"checkpoint {taken!r} of run 'ok' already exists in the target store; "
        "delete run 'ok' first"
    )
    assert (refused.value.checkpoint_id, refused.value.run_id) == (taken, "ok")
    assert await export_run(store, "ok") == document  # ok keeps every checkpoint
    assert await store.get_run("copy") is None


async def test_import_run_refuses_a_key_twice_in_a_record_and_writes_nothing(
    store: CheckpointStorage,
) -> None:
    # the record was imported, and read back with the last of the two values alone
    document, copied = await _run_and_a_copy(store)
    copied["checkpoints"] = []  # their ids are ok's: refused for that otherwise
    edit = _in_body("steps", 0, "body", old='"data":{"name"', new='"data":{"name":"x","name"')
    edit(copied)
    with pytest.raises(ExportFormatError) as refused:
        await import_run(store, copied)
    assert str(refused.value) == (
        'steps[0].body holds a dict at body.data with one key twice ("name" is there twice): '
        "a dict has each key once; give each key once"
    )
    assert await store.get_run("copy") is None  # nothing written
    assert await export_run(store, "ok") == document


def test_a_refused_import_leaves_the_target_store_as_it_was(
    cli: Cli, filled_any: Filled, tmp_path: Path
) -> None:
    url = filled_any.url
    document = asyncio.run(_source_document(tmp_path))
    # The runs of this test (a server store may be shared with other tests running).
    ids = (filled_any.ok, filled_any.bad, filled_any.gone, document["run"]["run_id"])
    before = asyncio.run(_everything(url, ids))
    path = tmp_path / "bad.json"
    for case, (edit, message) in BAD_EDITS.items():
        bad = copy.deepcopy(document)
        edit(bad)
        path.write_bytes(orjson.dumps(bad))
        result = cli("import", str(path), "--store", url)
        assert (result.exit_code, message in result.stderr) == (EXIT_USAGE, True), case
    assert asyncio.run(_everything(url, ids)) == before


async def _everything(url: str, run_ids: tuple[str, ...]) -> dict[str, Any]:
    """Each of those runs exported, None for one the store does not have."""
    store = open_store(url)
    try:
        held = {run.run_id for run in await store.list_runs() if run.run_id in run_ids}
        return {i: await export_run(store, i) if i in held else None for i in run_ids}
    finally:
        await store.close()


def test_an_import_of_an_export_without_some_steps_says_which(cli: Cli, tmp_path: Path) -> None:
    # Imported as it is (an export of a damaged store may hold such gaps), and said.
    document = asyncio.run(_source_document(tmp_path))
    run_id = document["run"]["run_id"]
    assert [s["seq"] for s in document["steps"]] == [1, 2, 3]
    target = f"sqlite:///{tmp_path / 'target.db'}"
    whole = tmp_path / "whole.json"
    whole.write_bytes(orjson.dumps(document))
    imported = cli("import", str(whole), "--store", target)
    assert (imported.exit_code, imported.stderr) == (0, "")
    for kept, said in (([3], "steps 1 to 2"), ([1, 3], "step 2")):
        gapped = copy.deepcopy(document)
        gapped["run"]["run_id"] = f"{run_id}-{len(kept)}"
        gapped["checkpoints"] = []  # their ids are the first import's
        gapped["steps"] = [s for s in document["steps"] if s["seq"] in kept]
        path = tmp_path / "gapped.json"
        path.write_bytes(orjson.dumps(gapped))
        result = cli("import", str(path), "--store", target)
        assert result.exit_code == 0, result.stderr
        them = "it" if said.startswith("step ") else "them"
        gid = gapped["run"]["run_id"]
        assert result.stderr == (
            f"note: the export holds no record of {said} of run {gid} (the store it came from "
            f"had lost {them}, or the file was edited): nestegg show {gid} marks {them} "
            f"missing, nestegg checkpoints {gid} shows the checkpoints a resume can still use\n"
        )
        shown = json_of(cli("show", gid, "--json", "--store", target))
        assert [s["seq"] for s in shown["steps"] if s["outcome"] == "missing"] == [
            seq for seq in (1, 2, 3) if seq not in kept
        ]
