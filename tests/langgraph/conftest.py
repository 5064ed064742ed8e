"""Savers over every store, each on an isolated location (as tests/stores does it)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("langgraph.checkpoint.base")

import os
import sqlite3
import uuid
from contextlib import closing

from nestegg.checkpoint.stores.file import FileCheckpointStorage
from nestegg.checkpoint.stores.file.threads import THREADS_DIR
from nestegg.checkpoint.stores.memory import MemoryCheckpointStorage
from nestegg.checkpoint.stores.postgres import PostgresCheckpointStorage
from nestegg.checkpoint.stores.redis import RedisCheckpointStorage
from nestegg.checkpoint.stores.sqlite import SQLiteCheckpointStorage
from nestegg.checkpoint.stores.threads import ROW_KINDS, ThreadStore
from nestegg.langgraph import NestEggSaver
from nestegg.langgraph.rows import prefix_range
from nestegg.testing.registry import StoreSite, registered_store
from tests.langgraph.graphs import build_loop, loop_config
from tests.registry import EMBEDDED_KINDS, SERVER_KINDS

STORE_KINDS = EMBEDDED_KINDS + SERVER_KINDS

SaverFactory = Callable[..., NestEggSaver]


def kinds(*wanted: str) -> list[Any]:
    """pytest params for those store kinds (the server ones marked)."""
    return [
        pytest.param(kind, marks=[pytest.mark.server] if kind in SERVER_KINDS else [])
        for kind in wanted or STORE_KINDS
    ]


@pytest.fixture
async def saver_factory(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[SaverFactory]:
    """Builds savers, each over a fresh isolated location of the store kind in
    ``request.param``; all closed and their locations removed at the end."""
    kind = request.param
    savers: list[NestEggSaver] = []
    spec = registered_store(kind)
    sites: list[StoreSite] = []

    def build(**options: Any) -> NestEggSaver:
        directory = tmp_path / f"s{len(savers)}"
        directory.mkdir()
        site = StoreSite(directory, uuid.uuid4().hex[:12], request)
        saver = NestEggSaver(spec.factory(site)(), close_storage=True, **options)
        savers.append(saver)
        sites.append(site)
        return saver

    yield build
    for saver in savers:
        await saver.aclose()
    if spec.cleanup is not None:
        for site in sites:
            await spec.cleanup(site)


def thread_config(thread_id: str, checkpoint_id: str | None = None, ns: str = "") -> Any:
    conf = {"thread_id": thread_id, "checkpoint_ns": ns}
    return {"configurable": conf | ({"checkpoint_id": checkpoint_id} if checkpoint_id else {})}


async def stored_rows(store: ThreadStore) -> dict[str, list[Any]]:
    """Every thread of ``store`` with every row of it."""
    stored = {}
    for info in await store.list_threads():
        rows = [
            row
            for kind in ROW_KINDS
            for row in await store.scan_thread_rows(info.thread_id, kind, *prefix_range(""))
        ]
        stored[info.thread_id] = rows
    return stored


async def thread_entries(store: ThreadStore) -> set[str]:
    """The threads ``store`` keeps an entry of where its listing looks, listed or not: a row
    of ``lg_threads`` (SQLite, PostgreSQL), a member of the threads' sorted set (Redis), a
    log (file), rows or a time (memory)."""
    if isinstance(store, MemoryCheckpointStorage):
        return set(store._threads()) | set(store._MemoryThreadRows__thread_times)
    if isinstance(store, FileCheckpointStorage):
        logs = store.root / THREADS_DIR
        names = os.listdir(logs) if logs.exists() else []
        return {store._thread_of(name) or name for name in names}
    if isinstance(store, SQLiteCheckpointStorage):
        with closing(sqlite3.connect(store.path)) as conn:
            return {thread_id for (thread_id,) in conn.execute("SELECT thread_id FROM lg_threads")}
    if isinstance(store, RedisCheckpointStorage):
        return {m.decode() for m in await store._client.zrange(store._threads_key(), 0, -1)}
    assert isinstance(store, PostgresCheckpointStorage)

    async def fetch(cursor: Any) -> set[str]:
        await cursor.execute(f'SELECT thread_id FROM "{store.table_prefix}lg_threads"')
        return {thread_id for (thread_id,) in await cursor.fetchall()}

    entries: set[str] = await store._with_connection(fetch, idempotent=True)
    return entries


def seeded_saver(saver_factory: SaverFactory, defer_writes: bool) -> NestEggSaver:
    """A saver whose store holds thread ``t``: five checkpoints (prune would drop four)."""
    saver = saver_factory(defer_writes=defer_writes)
    build_loop(saver, 3).invoke({"items": [], "turn": 0}, loop_config("t", 3))
    saver._run(saver._core.flush())  # settled: no deferred write left for a timer to commit
    return saver
