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
from nestegg.checkpoint.stores import open_store
from nestegg.checkpoint.stores.base import CheckpointStorage
from nestegg.cli.transfer import export_run, import_run
from nestegg.constants import EXIT_USAGE, MAX_NAME_LENGTH
from nestegg.errors import CheckpointExistsError, InvalidIdentifierError
from nestegg.testing import fixtures as store_fixtures
from tests.cli.conftest import Cli, fill, json_of
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


def _checkpoint_id_twice(document: dict[str, Any]) -> None:
    checkpoints = document["checkpoints"]
    checkpoints[1]["checkpoint_id"] = checkpoints[0]["checkpoint_id"]


BAD_EDITS: dict[str, tuple[Edit, str]] = {
    "path in run id": (_set("run", "run_id", value="../escape"), "path separator"),
    "empty run id": (_set("run", "run_id", value=""), "non-empty"),
    "long run id": (_set("run", "run_id", value="r" * (MAX_NAME_LENGTH + 1)), "at most"),
    "control character": (_set("run", "run_id", value="a\nb"), "control character"),
    "agent name": (_set("steps", 0, "agent", value="a/b"), "agent name of step 1"),
    "checkpoint id": (_set("checkpoints", 0, "checkpoint_id", value=".."), "checkpoint id"),
    "parent run": (_set("run", "parent_run", value="x/y"), "parent run id"),
    "status": (_set("run", "status", value="done"), "run.status 'done'"),
    "fence": (_set("run", "fence", value=0), "run.fence"),
    "step seq": (_set("steps", 0, "seq", value=99), "steps: sequence number 99"),
    "event seq": (_set("events", 0, "seq", value=0), "events: sequence number 0"),
    "journal step": (_set("journal", 0, "step", value=0), "journal: step 0"),
    "lease far off": (_set("run", "lease_until", value=1e300), "run.lease_until must be UNIX"),
    "created null": (_set("run", "created_at", value=None), "run.created_at must be UNIX"),
    "event time": (_set("events", 0, "at", value=-1), "events[].at must be UNIX seconds"),
    "seq as text": (_set("steps", 0, "seq", value="1"), "steps[].seq must be a whole number"),
    "fence as bool": (_set("run", "fence", value=True), "run.fence must be a whole number"),
    "checkpoint id twice": (_checkpoint_id_twice, "checkpoints: a checkpoint id appears twice"),
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
    ids = {document["run"]["run_id"], bad["run"]["run_id"]}
    try:
        result = cli("import", str(path), "--store", any_url)
        assert result.exit_code == EXIT_USAGE, (result.stdout, result.stderr)
        assert message in result.stderr and len(result.stderr.splitlines()) == 1
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


async def test_an_import_refuses_a_checkpoint_id_another_run_of_the_store_has(
    store: CheckpointStorage,
) -> None:
    clutch = build("cli-test", CheckpointConfig(storage=store, policy=POLICY))
    await clutch.run({"name": "Acme"}, run_id="ok")
    document = await export_run(store, "ok")
    copied = copy.deepcopy(document)
    copied["run"]["run_id"] = "copy"  # the checkpoint ids kept: they are ok's
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
